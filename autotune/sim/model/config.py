"""SimConfig: the vLLM launch flags the simulator models, parsed and typed.

``autotune.sim.server.flags`` turns a ``vllm serve`` argv into a SimConfig (the
server and the in-process predictor both go through it); the memory and time
models read only this.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SimConfig(BaseModel):
    """Everything the memory and speed models need from the launch flags."""

    model_config = ConfigDict(frozen=True)

    model: str  # catalog name, e.g. "qwen3.6-27b-awq"
    hardware: str  # catalog name, e.g. "rtx4080s-32g"
    kv_cache_memory_bytes: int | None = None  # wins over gpu_memory_utilization
    gpu_memory_utilization: float = 0.92
    kv_cache_dtype: str = "auto"
    num_speculative_tokens: int = 0  # MTP k (0: off)
    max_num_seqs: int | None = None  # None: vLLM's hardware default
    max_num_batched_tokens: int | None = None  # None: vLLM's hardware default
    max_model_len: int | None = None  # None: the model's own maximum
    cudagraph_capture_sizes: tuple[int, ...] | None = None  # None: vLLM's default list
    enable_prefix_caching: bool | None = None  # None: the engine default for the model
    language_model_only: bool = False
    lmcache: bool = False  # --kv-transfer-config with an LMCache connector
    block_size: int | None = None
    enforce_eager: bool = False
    seed: int = 0
    tensor_parallel_size: int = 1  # GPUs of one node the model is sharded over
    # Per-position draft acceptance rates (a workload property); None: the model's default.
    mtp_acceptance: tuple[float, ...] | None = None

    def as_modelled(self) -> SimConfig:
        """This config as the memory and speed models see it: values they model alike made
        equal, so that one prediction stands for every config with the same key."""
        dtype = KV_DTYPES_MODELLED_AS.get(self.kv_cache_dtype, self.kv_cache_dtype)
        return (
            self
            if dtype == self.kv_cache_dtype
            else self.model_copy(update={"kv_cache_dtype": dtype})
        )


# KV dtypes the models treat alike: one byte an element (kv_layout.py) and no speed term
# of their own. vLLM's "fp8" is fp8_e4m3 on CUDA; e5m2 differs in precision, not in size.
KV_DTYPES_MODELLED_AS = {"fp8": "fp8_e4m3", "fp8_e5m2": "fp8_e4m3"}
