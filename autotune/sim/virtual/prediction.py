"""What a whole replay of a config predicts (``predict.py`` computes it; ``shared_runs.py``
keeps it for other pool sizes)."""

from __future__ import annotations

from pydantic import BaseModel

from autotune.replay.load_policy import Progress
from autotune.replay.records import ReplayStats, RequestRecord
from autotune.sim.model.memory import MemoryReport
from autotune.vocabulary import Failure, ServerStats, StartupReport


class Prediction(BaseModel):
    """What a replay of the plan would have measured, and why it failed if it did."""

    records: list[RequestRecord]
    stats: ReplayStats
    server_stats: ServerStats
    memory: MemoryReport
    startup: StartupReport | None
    failure: Failure | None
    # Relative error to expect (the calibration profile's); None: uncalibrated.
    expected_error: float | None = None
    # The window's throughput so far, as the HTTP replay reports it (pruning).
    progress: list[Progress] = []
