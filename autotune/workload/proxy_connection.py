"""The recording proxy's connections: a deadline on every request head.

uvicorn bounds neither the time a client takes to send a request's head (request
line and headers) nor, once a byte has come, an idle keep-alive connection (its
keep-alive timer is cancelled by the first byte of the next head), so a client that
trickles a header line every few seconds holds its connection, and a descriptor, for
as long as it trickles. Here each head must be whole within ``HEAD_TIMEOUT_S`` of the
connection opening or of the previous answer's end, else the connection is closed
(no answer: there is no request to answer). Bodies have their own deadlines
(``autotune.workload.proxy``).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# A client sends a request's head (a few KB) in one write: 10 s is ample on any link a
# user records over, and frees a slow-loris connection within seconds.
HEAD_TIMEOUT_S = 10.0
# A keep-alive connection with no request is closed after this (uvicorn's own default,
# named here); its next head, once begun, has the rest of ``HEAD_TIMEOUT_S``.
KEEP_ALIVE_IDLE_S = 5


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head."""

    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a head was read: its request runs
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()  # before: the next cycle may read a pipelined head at once
        super().on_response_complete()
        if self.transport.is_closing():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_deadline = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
