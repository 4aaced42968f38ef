"""Watchdog for one server session: run as a script (process.py reuses its /proc scan).

    python -I -S _watchdog.py SESSION_ID GRACE_S   (stdin: a pipe from autotune)

It blocks reading one byte from stdin. autotune writes ``q`` when it has stopped
the server itself; if autotune dies instead (even by SIGKILL) the pipe closes, the
read returns nothing, and the watchdog takes the whole session down: SIGTERM, then
SIGKILL after GRACE_S. PR_SET_PDEATHSIG on the server alone is not enough: vLLM's
EngineCore and workers are grandchildren. Kept to the standard library so it
starts in tens of milliseconds (no autotune imports).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.1


def session_members(session_id: int) -> list[int]:
    """Live (non-zombie) processes of a session, from /proc (empty where /proc is absent)."""
    members = []
    proc = Path("/proc")
    if not proc.is_dir():
        return members
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after "(comm)": state ppid pgrp session ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[3]) == session_id and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def kill_session(session_id: int, grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [session_id, *session_members(session_id)]:
            try:
                if pid == session_id:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace_s
        while session_members(session_id) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if not session_members(session_id):
            return


def main(argv: list[str]) -> int:
    session_id, grace_s = int(argv[0]), float(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if sys.stdin.buffer.read(1) == b"q":
        return 0
    kill_session(session_id, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
