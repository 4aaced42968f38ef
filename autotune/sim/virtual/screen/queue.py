"""The screen's request-level queue, for a block of configs at once (numpy, one row a config).

Per request, in order of readiness (sessions: when its parents are done plus its gap;
trace: its arrival; concurrency: when a slot frees):

- it takes a seat (max-num-seqs), first come, first served;
- it waits for room in the KV pool for its context (past the shared prefix, which the
  pool holds once; in whole blocks; with its state blocks on a hybrid model);
- its uncached prompt is prefilled in chunks of max-num-batched-tokens, one prefill at a
  time. What is cached: the shared prefix, and of its own earlier context what the pool's
  LRU still holds (``_kept``); LMCache loads the rest of its reusable prefix over PCIe;
- it decodes its output at the pace of ``pace.py``.

A pass takes from the last one what depends on the whole schedule: the decode batch
(Little's law), the prefills and waits beside each decode, what the LRU kept, and (more
sessions than slots) when each session starts. The first pass guesses them.
"""

from __future__ import annotations

import numpy as np

from autotune.replay.load import RequestSlo
from autotune.replay.records import ReplayStats
from autotune.sim.virtual.screen.figures import figures
from autotune.sim.virtual.screen.pace import DecodePace
from autotune.sim.virtual.screen.terms import BATCH_LADDER, ConfigTerms
from autotune.sim.virtual.screen.traffic import Traffic

PASSES = 4  # passes over the workload (each settles on the last one's schedule)
KEEP_EXPONENT = 0.4  # the first pass's guess: LRU keeps more of a prefix than the pool's share


class Queue:
    """The queue of the module docstring for ``terms`` (one config each) under ``traffic``."""

    def __init__(self, terms: list[ConfigTerms], traffic: Traffic) -> None:
        self.traffic = traffic
        self.count = count = len(terms)
        self.n = n = len(traffic.prompt)
        self.rows = np.arange(count)

        def column(name: str) -> np.ndarray:
            return np.array([getattr(t, name) for t in terms], dtype=np.float64)

        self.seats, self.chunk = column("seats"), column("chunk")
        self.per_step = column("tokens_per_step")
        self.fixed_s = np.array([t.costs.chunk_fixed_s for t in terms])
        self.token_s = np.array([t.costs.chunk_token_s for t in terms])
        self.pair_s = np.array([t.costs.chunk_pair_s for t in terms])
        self.decode_table = np.array([t.costs.decode_s for t in terms])
        self.pool, self.state = column("pool_tokens"), column("state_tokens")
        self.host = np.array([t.host_store for t in terms])
        self.caching = np.array([t.caching for t in terms])
        self.load_s = column("load_token_s")
        self.reuse = np.array([traffic.reuse(t.unit_tokens) for t in terms])  # count x n
        self.prompt, self.output = traffic.prompt[None, :], traffic.output[None, :]
        sessions = traffic.sessions
        self.active = float(min(traffic.slots, sessions)) if traffic.mode != "trace" else sessions
        in_flight = n if traffic.mode == "trace" else int(self.active)  # at most, at once
        self.max_seats = int(min(max(self.seats.max(initial=1.0), 1.0), n or 1, max(1, in_flight)))
        # The KV a running request holds: its context past the shared prefix, in whole
        # blocks, and its state; at most what the pool has beside the shared prefix.
        block = column("block_tokens")
        self.shared = np.where(self.caching, traffic.shared_prefix, 0.0)[:, None]
        self.capacity = np.maximum(self.pool - self.shared[:, 0], block)
        held = np.maximum(self.prompt + self.output - self.shared, 1.0)
        need = np.ceil(held / block[:, None]) * block[:, None] + self.state[:, None]
        self.need = np.minimum(need, self.capacity[:, None])
        # ... of which the prefix cache's LRU holds the context (state blocks hold no prefix)
        self.held = np.minimum(need - self.state[:, None], self.capacity[:, None])
        self.own = np.maximum(self.reuse - self.shared, 0.0)  # reusable past the shared prefix
        self.parents = _padded(traffic.parents, n)
        children: list[list[int]] = [[] for _ in range(n)]
        for child, found in enumerate(traffic.parents):
            for parent in found:
                children[parent].append(child)
        self.children = _padded(children, n)

    def run(self, slo: RequestSlo | None) -> list[tuple[ReplayStats, float, float]]:
        """Per config: its figures, the most requests running at once and the largest
        step (tokens)."""
        count, n, traffic = self.count, self.n, self.traffic
        batch = np.minimum(self.seats, max(1.0, self.active / 2))
        session_start = np.zeros((count, traffic.sessions))
        kept = self._first_kept(batch)
        pace: DecodePace | None = None
        for _ in range(PASSES):
            local = np.where(self.caching[:, None], np.minimum(self.reuse, self.shared) + kept, 0.0)
            external = np.where(self.host[:, None], self.reuse - local, 0.0)
            uncached = np.maximum(self.prompt - local - external, 1.0)
            chunks = np.ceil(uncached / self.chunk[:, None])
            step_s = _interpolate_rows(batch, np.array(BATCH_LADDER, float), self.decode_table)
            beside_s = np.maximum(step_s - self.decode_table[:, 0], 0.0)  # the batch's share
            prefill_s = (
                chunks * (self.fixed_s + beside_s)[:, None]
                + uncached * self.token_s[:, None]
                + self.pair_s[:, None] * uncached * (local + external + uncached / 2)
                + external * self.load_s[:, None]
            )
            if pace is None:
                pace = DecodePace.idle(step_s)
            timeline = self._pass(prefill_s, pace, session_start)
            ready, seated, waited, begun, first, finish = timeline
            window = np.maximum(finish.max(axis=1, initial=0.0), 1e-9)
            batch = np.clip((finish - first).sum(axis=1) / window, 1.0, np.maximum(self.seats, 1.0))
            full_chunk_s = self.fixed_s + self.chunk * self.token_s + beside_s
            pace = DecodePace.from_timeline(
                (begun, first, chunks), (waited, seated), full_chunk_s, step_s
            )
            kept = self._kept(seated, finish)
            if traffic.mode == "sessions":
                session_start = _session_starts(traffic, ready, finish)
        output = self.output
        tpot = np.where(output > 1, (finish - first) / np.maximum(output - 1, 1), np.nan)
        itl = np.repeat((step_s / self.per_step)[:, None], n, axis=1)
        running = _peak_running(seated, finish)
        step_tokens = np.minimum(
            self.chunk, uncached.max(axis=1, initial=1.0) + running * self.per_step
        )
        stats = figures(window, first - ready, tpot, itl, finish - ready, traffic, slo)
        return [(stats[c], running[c], step_tokens[c]) for c in range(count)]

    def _pass(
        self, prefill_s: np.ndarray, pace: DecodePace, session_start: np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """One pass: per config and request, when it was ready, seated (room in the pool
        found), began waiting for room, began its prefill, had its first token, ended."""
        count, n, rows, traffic = self.count, self.n, self.rows, self.traffic
        steps_needed = np.maximum(self.output - 1.0, 0.0) / self.per_step[:, None]
        ready_at, seated, waited, begun, first, finish = (np.zeros((count, n)) for _ in range(6))
        seat_free = np.where(
            np.arange(self.max_seats)[None, :] < np.floor(self.seats)[:, None], 0.0, np.inf
        )
        seat_kv = np.zeros((count, self.max_seats))
        prefill_free = np.zeros(count)
        last_start = np.zeros(count)
        slot_free = np.zeros((count, max(1, traffic.slots)))
        readiness = _Readiness(self, session_start) if traffic.mode == "sessions" else None
        order = np.argsort(traffic.wait, kind="stable") if traffic.mode == "trace" else np.arange(n)
        in_order = traffic.mode != "concurrency"  # taken in order of readiness
        for k in range(n):
            if readiness is not None:
                col, ready = readiness.next()
            else:
                col = np.full(count, order[k])
                ready = _ready(traffic, int(order[k]), slot_free)
            ready_at[rows, col] = ready
            start = np.maximum(ready, seat_free.min(axis=1))
            if in_order:
                start = np.maximum(start, last_start)
            need = self.need[rows, col]
            seated_now = _room(start, seat_free, seat_kv, need, self.capacity)
            waited[rows, col] = np.maximum(start, last_start)
            last_start = seated_now
            seat = np.argmin(seat_free, axis=1)
            seated[rows, col] = seated_now
            begin = np.maximum(seated_now, prefill_free)
            begun[rows, col] = begin
            prefill_free = begin + prefill_s[rows, col]
            first[rows, col] = prefill_free
            done = np.maximum(
                pace.time_at(pace.steps_at(prefill_free) + steps_needed[rows, col]), prefill_free
            )
            finish[rows, col] = done
            seat_free[rows, seat] = done
            seat_kv[rows, seat] = need
            if traffic.mode == "concurrency":  # the slot is held until the request ends
                slot_free[rows, np.argmax(np.isinf(slot_free), axis=1)] = done
            if readiness is not None:
                readiness.done(col, done)
        return ready_at, seated, np.minimum(waited, seated), begun, first, finish

    def _first_kept(self, batch: np.ndarray) -> np.ndarray:
        """The first pass's guess of the reusable prefix (past the shared one) the pool
        keeps: its share of what the sessions in flight hold, LRU keeping more of it."""
        working = self.active * float(np.mean(self.traffic.prompt)) if self.n else 1.0
        holding = working + np.minimum(batch, self.seats) * self.state
        share = np.clip(self.pool / holding, 0.0, 1.0) ** KEEP_EXPONENT
        return self.own * share[:, None]

    def _kept(self, seated: np.ndarray, finish: np.ndarray) -> np.ndarray:
        """Per config and request, the tokens of its own reusable prefix (past the shared
        one) the pool still holds when it is seated, from the last pass's timeline: its
        session's last request left its prompt cached, and the least recently used blocks
        go first, so it keeps what the other sessions' contexts touched since (each
        session's latest, which holds its earlier ones) leave of the pool."""
        traffic, rows = self.traffic, self.rows
        kept = self.own.copy()
        if traffic.mode != "sessions" or not self.n:
            return kept
        order = np.argsort(traffic.session, kind="stable")  # each session's requests together
        session_of = traffic.session[order]
        starts = np.flatnonzero(np.diff(session_of, prepend=-1))
        positions = np.arange(self.n)
        seated_by = seated[:, order]
        for k in np.flatnonzero(self.parents[:, 0] >= 0):
            parents = self.parents[k][self.parents[k] >= 0]
            since = finish[:, parents].max(axis=1)  # its context was last used then
            begun = seated_by < seated[:, k][:, None]
            latest = np.maximum.reduceat(np.where(begun, positions, -1), starts, axis=1)
            request = order[np.maximum(latest, 0)]  # count x sessions
            touched = (latest >= 0) & (finish[rows[:, None], request] > since[:, None])
            touched[:, traffic.session[k]] = False
            used = np.where(touched, self.held[rows[:, None], request], 0.0).sum(axis=1)
            kept[:, k] = np.minimum(self.own[:, k], np.maximum(self.capacity - used, 0.0))
        return kept


class _Readiness:
    """Sessions: each config's requests in order of readiness (a request is ready its gap
    after its last parent ends, a session's first its gap after the session starts)."""

    def __init__(self, queue: Queue, session_start: np.ndarray) -> None:
        traffic, count, n = queue.traffic, queue.count, queue.n
        self.rows, self.wait, self.children = queue.rows, traffic.wait, queue.children
        has_parent = queue.parents[:, 0] >= 0
        first = session_start[:, traffic.session] + traffic.wait[None, :]
        self.known = np.where(has_parent[None, :], np.inf, first)
        self.pending = np.broadcast_to((queue.parents >= 0).sum(axis=1), (count, n)).copy()
        self.parent_end = np.full((count, n), -np.inf)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """Per config, the readiest request not yet taken, and when it is ready."""
        col = np.argmin(self.known, axis=1)
        ready = self.known[self.rows, col]
        self.known[self.rows, col] = np.inf
        return col, ready

    def done(self, col: np.ndarray, end: np.ndarray) -> None:
        """Request ``col`` (per config) ends at ``end``: its children may become ready."""
        rows = self.rows
        for child in self.children[col].T:
            has = child >= 0
            at = np.where(has, child, 0)
            self.parent_end[rows, at] = np.where(
                has, np.maximum(self.parent_end[rows, at], end), self.parent_end[rows, at]
            )
            self.pending[rows, at] -= has
            now = has & (self.pending[rows, at] == 0)
            self.known[rows, at] = np.where(
                now, self.parent_end[rows, at] + self.wait[at], self.known[rows, at]
            )


def _padded(lists: list[list[int]] | tuple[tuple[int, ...], ...], n: int) -> np.ndarray:
    """Ragged lists of request indices as an n x width array, -1 where none."""
    width = max(1, max((len(found) for found in lists), default=0))
    padded = np.full((n, width), -1, dtype=np.int64)
    for index, found in enumerate(lists):
        padded[index, : len(found)] = found
    return padded


def _room(
    start: np.ndarray,
    seat_free: np.ndarray,
    seat_kv: np.ndarray,
    need: np.ndarray,
    capacity: np.ndarray,
) -> np.ndarray:
    """Per config, the earliest time from ``start`` at which the pool holds ``need`` more
    tokens beside what the seated requests hold (each until its seat frees)."""
    order = np.argsort(seat_free, axis=1)
    free_at = np.take_along_axis(seat_free, order, axis=1)
    holding = np.where(np.isfinite(free_at), np.take_along_axis(seat_kv, order, axis=1), 0.0)
    holding = np.where(free_at > start[:, None], holding, 0.0)
    total = holding.sum(axis=1, keepdims=True)
    after_each = total - np.cumsum(holding, axis=1)  # once the i-th seat to free has freed
    times = np.concatenate([start[:, None], np.maximum(start[:, None], free_at)], axis=1)
    used = np.concatenate([total, after_each], axis=1)
    fits = used + need[:, None] <= capacity[:, None] + 1e-6
    fits[:, -1] = True
    found = times[np.arange(len(start)), np.argmax(fits, axis=1)]
    return np.where(np.isfinite(found), found, start)


def _ready(traffic: Traffic, i: int, slot_free: np.ndarray) -> np.ndarray:
    """When request ``i`` is sent (trace: its arrival; concurrency: when a slot frees,
    which it then holds until it ends)."""
    if traffic.mode == "trace":
        return np.full(slot_free.shape[0], traffic.wait[i])
    rows = np.arange(slot_free.shape[0])
    slot = np.argmin(slot_free, axis=1)
    ready = slot_free[rows, slot].copy()
    slot_free[rows, slot] = np.inf  # until the request ends
    return ready


def _session_starts(traffic: Traffic, ready_at: np.ndarray, finish: np.ndarray) -> np.ndarray:
    """Each session's start: its slot among ``traffic.slots`` (the first free, in order),
    given how long this pass's sessions lasted."""
    count, sessions = finish.shape[0], traffic.sessions
    begun = np.full((count, sessions), np.inf)
    ended = np.zeros((count, sessions))
    for i in range(len(traffic.session)):
        s = int(traffic.session[i])
        begun[:, s] = np.minimum(begun[:, s], ready_at[:, i] - traffic.wait[i])
        ended[:, s] = np.maximum(ended[:, s], finish[:, i])
    lengths = ended - np.where(np.isfinite(begun), begun, 0.0)
    starts = np.zeros((count, sessions))
    slots = np.zeros((count, max(1, traffic.slots)))
    rows = np.arange(count)
    for s in range(sessions):
        slot = np.argmin(slots, axis=1)
        starts[:, s] = slots[rows, slot]
        slots[rows, slot] += lengths[:, s]
    return starts


def _peak_running(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per config (row), the most requests between their ``start`` and ``end`` at once."""
    count, n = start.shape
    if not n:
        return np.zeros(count)
    times = np.concatenate([start, end], axis=1)
    steps = np.concatenate([np.ones((count, n)), -np.ones((count, n))], axis=1)
    order = np.lexsort((steps, times), axis=1)  # at equal times an end goes first
    return np.cumsum(np.take_along_axis(steps, order, axis=1), axis=1).max(axis=1)


def _interpolate_rows(x: np.ndarray, ladder: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Per row, ``table``'s value at ``x`` (linear between the ladder's batches)."""
    position = np.clip(np.searchsorted(ladder, x, side="right") - 1, 0, len(ladder) - 2)
    low, high = ladder[position], ladder[position + 1]
    weight = np.clip((x - low) / (high - low), 0.0, 1.0)
    rows = np.arange(len(x))
    return table[rows, position] * (1 - weight) + table[rows, position + 1] * weight
