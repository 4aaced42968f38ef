"""A stored study's inputs as the simulator reads them: its catalog GPU, a config's
``SimConfig``, and its workload and load (checked against what the study stored)."""

from __future__ import annotations

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.config.trial_config import TrialConfig
from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.results.reader import LoadedStudy
from autotune.sim.model.config import SimConfig
from autotune.sim.server.flags import parse_serve_args
from autotune.workload.expand import load_plan
from autotune.workload.plan import WorkloadPlan


def study_gpu_names(loaded: LoadedStudy) -> list[str]:
    """Every name the study's GPU goes by (fingerprint name, simulator catalog name)."""
    names = [loaded.info.gpu_name]
    for row in loaded.trials:
        if row.argv and "--hardware" in row.argv:
            names.append(row.argv[row.argv.index("--hardware") + 1])
            break
    return names


def catalog_gpu(loaded: LoadedStudy) -> str:
    """The simulator catalog name of the GPU the study ran on. Raises ``InputError``."""
    for name in study_gpu_names(loaded):
        try:
            get_gpu(name)
        except InputError:
            continue
        return name
    raise InputError(
        f"study {loaded.name!r} ran on {loaded.info.gpu_name!r}, which is not in the "
        "simulator's GPU catalog (autotune sim catalog): no calibration for --what-if"
    )


def sim_config(config: TrialConfig, gpu: str) -> SimConfig:
    """The simulator's reading of ``config`` launched on catalog GPU ``gpu``."""
    get_gpu(gpu)
    get_model(config.model)
    try:
        return parse_serve_args([*config.vllm_args(), "--hardware", gpu]).sim
    except SystemExit as exc:  # argparse has printed why
        raise InputError(f"the simulator cannot read the config {config.vllm_args()}") from exc


def study_plan(loaded: LoadedStudy) -> tuple[WorkloadPlan, LoadSpec]:
    """The study's own workload and load, checked against the stored digest."""
    workload = loaded.info.workload
    path = loaded.stored_file(str(workload.get("path", "")), "workload")
    if not path.is_file():
        raise InputError(f"study {loaded.name!r}: workload file {path} is gone")
    plan = load_plan(path)
    stored = workload.get("digest")
    if stored and stored != plan.digest:
        raise InputError(f"study {loaded.name!r}: {path} changed since the study ran")
    return plan, LoadSpec.model_validate(loaded.info.load)
