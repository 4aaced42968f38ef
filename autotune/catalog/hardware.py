"""The GPU catalog (autotune/catalog/data/gpus.yaml) as typed specs."""

from __future__ import annotations

import functools
from importlib import resources
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from autotune.errors import InputError

CATALOG_FILE = "gpus.yaml"
SpecT = TypeVar("SpecT", bound=BaseModel)
DEFAULT_MAX_CUDAGRAPH_CAPTURE_SIZE = 512  # vllm/config/vllm.py _set_cudagraph_sizes
MAX_TENSOR_PARALLEL_SIZE = 8  # the GPUs of one node: the simulator models no multi-node TP
DATASHEET_ONLY = "datasheet peaks, shared efficiencies"


class GpuSpec(BaseModel):
    """One accelerator: memory in bytes, bandwidth in bytes/s, dense peak FLOP/s."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    family: str  # "ada", "ampere", "hopper", ...: picks vLLM's batch defaults
    memory_bytes: int
    visible_bytes: int  # what CUDA reports as total memory
    free_at_startup_bytes: int  # free when vLLM starts
    bandwidth_bytes_s: float
    bf16_flops: float
    fp8_flops: float
    int4_flops: float
    pcie_bytes_s: float
    interconnect_bytes_s: float  # GPU to GPU, a direction (tensor-parallel all-reduces)
    interconnect_latency_s: float  # one small all-reduce
    non_torch_bytes: int
    # Where the speed model's figures for this GPU come from, in words (printed beside it by
    # `compare --what-if` and `plan`), and the SpeedConstants fields it sets apart from the
    # shared defaults (sim/model/speed_constants.py), e.g. fitted to published runs.
    speed_source: str = DATASHEET_ONLY
    speed: dict[str, float] = {}


def load_catalog(file_name: str, spec_type: type[SpecT]) -> dict[str, SpecT]:
    """A catalog file under autotune/catalog/data/ as ``{name: spec}``; InputError names it."""
    raw = yaml.safe_load(
        resources.files("autotune.catalog").joinpath("data", file_name).read_text()
    )
    catalog: dict[str, SpecT] = {}
    for name, fields in raw.items():
        try:
            catalog[name] = spec_type(name=name, **fields)
        except ValidationError as exc:
            raise InputError(f"autotune/catalog/data/{file_name}: {name}: {exc}") from exc
    return catalog


@functools.cache
def _gpu_catalog() -> dict[str, GpuSpec]:
    return load_catalog(CATALOG_FILE, GpuSpec)


def gpu_names() -> list[str]:
    """Names of every GPU in the catalog."""
    return list(_gpu_catalog())


def get_gpu(name: str) -> GpuSpec:
    """The catalog entry for ``name``; InputError naming the known GPUs otherwise."""
    catalog = _gpu_catalog()
    spec = catalog.get(name)
    if spec is None:
        known = ", ".join(catalog)
        raise InputError(f"unknown hardware {name!r} (simulator GPU catalog: {known})")
    return spec
