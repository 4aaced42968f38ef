"""Lockstep: the replay client holds the simulator's clock, so host load cannot move a figure.

On scaled wall time a busy host changes what the simulator answers: a request reaches
the engine some wall milliseconds late (times the scale in modelled seconds), the engine
loop falls behind, the client stamps tokens late. In lockstep the client and the engine
share one clock, the engine's modelled one, and neither runs ahead of the other:

- the client says how far the engine may go (``until_s``: its next send, scrape or
  deadline) and how many requests it has sent; the engine waits until that many have
  reached it, admits them in the client's order, then steps while its clock is before
  ``until_s``, and holds after any step in which a request of the client finished (the
  client may answer it at once), or once the clock has reached ``until_s``;
- each request says when it was sent on that clock (``x-autotune-at``) and its place in
  the client's order (``x-autotune-seq``); every SSE write of its answer starts with a
  comment line ``: t=<modelled seconds>``, the time its events happened, which the client
  measures in instead of its wall clock; the last one adds `` end=<n>``, the request's
  place among the ends the engine counted, so the client can take the answers of one
  step in the engine's order.

What the engine does is then a function of the workload, the config and the seed alone.
The wall clock only paces it (never faster than ``--time-scale``); a slow host makes a
trial take longer, not measure differently. Requests without the headers (any other
client, or no lockstep) are served on scaled wall time as before.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClockedArrival:
    """A request of the lockstep client: when it was sent and its place in the order."""

    at_s: float
    seq: int


@dataclass
class LockstepClock:
    """The engine's side of lockstep: what the client allows, and what has happened since.

    The counters only grow. ``ended`` counts the client's requests that ended on the
    server (finished, aborted, or answered with an error before reaching the engine):
    the client waits until it has seen as many end before it moves the clock again.
    """

    until_s: float | None = None  # the engine may start steps before this; None: no bound
    expected: int = 0  # requests the client has sent so far
    registered: int = 0  # of those, that reached the server
    ended: int = 0
    completion_pending: bool = False  # a client's request finished: hold until the next grant
    _held: asyncio.Event = field(default_factory=asyncio.Event)

    def grant(self, until_s: float | None, sent: int) -> None:
        """The client's next move: go on until ``until_s``, once ``sent`` requests arrived."""
        self.until_s = until_s
        self.expected = max(self.expected, sent)
        self.completion_pending = False
        self._held.clear()

    @property
    def all_arrived(self) -> bool:
        return self.registered >= self.expected

    def must_hold(self, clock_s: float, busy: bool) -> bool:
        """Whether the engine holds at ``clock_s`` (``busy``: it has requests to step)."""
        if self.completion_pending:
            return True
        if self.until_s is None:
            return not busy  # nothing bounds it, but nothing can happen either
        return clock_s >= self.until_s

    def hold(self) -> None:
        """The engine stopped where the client must look: wake its waiting grant."""
        self._held.set()

    async def wait_held(self) -> None:
        await self._held.wait()
