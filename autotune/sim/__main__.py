"""``python -m autotune.sim serve MODEL [vllm serve flags] --hardware NAME ...``."""

from __future__ import annotations

import sys

from autotune.sim.server.server import main

USAGE = "usage: python -m autotune.sim serve MODEL [vllm serve flags] --hardware NAME"


def _entry(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print(USAGE, file=sys.stderr)
        return 2
    return main(argv[1:])


if __name__ == "__main__":
    sys.exit(_entry(sys.argv[1:]))
