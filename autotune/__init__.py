"""vllm-autotune: tune vLLM launch flags on your GPU and your traffic."""

__version__ = "0.1.0"
