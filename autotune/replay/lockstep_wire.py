"""Lockstep's wire format, shared by the replay client and the simulator's server.

A lockstep replay (``replay/lockstep_driver.py``; the server's half in
``sim/server/lockstep.py``) dates each request with its send time on the simulator's
clock and its place in the client's order (two headers), and the simulator dates the
events of each answer with an SSE comment line before them. The client's driver moves
the simulator's clock at ``LOCKSTEP_PATH``.
"""

from __future__ import annotations

LOCKSTEP_PATH = "/autotune/lockstep"  # POST: start (DELETE: end); POST .../advance: run on
AT_HEADER = "x-autotune-at"  # modelled send time on the simulator's clock (seconds)
SEQ_HEADER = "x-autotune-seq"  # the request's place in the client's order
STAMP_PREFIX = b": t="  # an SSE comment line: when the events after it happened
END_MARK = b" end="  # on the last date line: the request's place among the engine's ends


def stamp_line(t_s: float, end_order: int | None = None) -> bytes:
    """The SSE comment that dates the events after it (modelled seconds)."""
    end = b"" if end_order is None else END_MARK + str(end_order).encode()
    return STAMP_PREFIX + repr(t_s).encode() + end + b"\n"


def read_stamp(line: bytes) -> tuple[float, int | None]:
    """A date line's time and, on the last one, the request's place among the ends."""
    text, _, end = line[len(STAMP_PREFIX) :].partition(END_MARK)
    return float(text), int(end) if end else None
