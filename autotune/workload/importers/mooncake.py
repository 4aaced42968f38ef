"""Import Mooncake traces: JSONL of ``{timestamp (ms), input_length, output_length, hash_ids}``.

Hash ids name prefix-chained 512-token blocks and are global, so every
request is an independent blocks-mode request with its recorded arrival.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from autotune.errors import WorkloadError
from autotune.workload.importers._report import ImportReport
from autotune.workload.io import Workload
from autotune.workload.plan import Endpoint
from autotune.workload.schema import (
    FORMAT_VERSION,
    BlocksInput,
    Header,
    Output,
    RequestRecord,
)

BLOCK_SIZE = 512


def import_mooncake(
    source: Path, *, endpoint: Endpoint = "openai.chat"
) -> tuple[Workload, ImportReport]:
    """Convert a Mooncake JSONL trace. Raises WorkloadError if it cannot be read."""
    report = ImportReport(str(source))
    requests: list[RequestRecord] = []
    try:
        lines = source.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{source}: cannot read Mooncake trace: {exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        report.read["lines"] += 1
        try:
            row = json.loads(line)
            t_s = float(row["timestamp"]) / 1000
            hash_ids = [int(h) for h in row["hash_ids"]]
            tokens = int(row["input_length"])
            output = int(row["output_length"])
        except (KeyError, TypeError, ValueError, RecursionError):  # JSONDecodeError is a ValueError
            report.dropped["malformed line (JSON or a missing field)"] += 1
            continue
        if output < 1:
            report.adjusted["output_length 0 replayed as 1 token"] += 1
            output = 1
        try:
            requests.append(
                RequestRecord(
                    id=f"m{number:06d}",
                    t_s=t_s,
                    input=BlocksInput(hash_ids=hash_ids, tokens=tokens),
                    output=Output(tokens=output),
                    input_tokens=tokens,
                )
            )
        except ValidationError:
            report.dropped["invalid values (negative time, empty hash_ids, ...)"] += 1
            continue
        if tokens <= BLOCK_SIZE * (len(hash_ids) - 1):
            requests.pop()
            report.dropped["hash_ids longer than input_length allows"] += 1
    if not requests:
        raise WorkloadError(f"{source}: no valid Mooncake requests")
    report.read["requests"] = len(requests)
    header = Header(
        version=FORMAT_VERSION,
        name=source.stem,
        token_space="kimi",
        block_size=BLOCK_SIZE,
        hash_scope="global",
        endpoint=endpoint,
        source={"kind": "mooncake", "path": str(source)},
    )
    return Workload(header, {}, requests), report
