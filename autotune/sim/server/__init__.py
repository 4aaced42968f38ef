"""The simulator's HTTP face: a `vllm serve` look-alike on a real port."""
