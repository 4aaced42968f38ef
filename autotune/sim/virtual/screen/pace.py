"""How fast a decoding request advances, given what runs beside it.

A decode step alone takes the batch's decode step time; a step that carries a prefill
chunk takes the chunk's time, and every decoding request advances one step in it too
(vLLM mixes them in one batch of at most max-num-batched-tokens). So per config the
steps a decoder makes by time t are piecewise linear in t: while a prefill runs, at its
chunks per second; while a request waits for room in the KV pool, at one full chunk per
step (vLLM admits it as soon as a chunk fits, preempts it when the running ones grow,
admits it again: the steps carry its chunks all the while); else at one step per decode
step time. The queue reads the last pass's timeline so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DecodePace:
    """Per config (row): the decode steps made by each of ``times`` (both ascending)."""

    times: _Curve  # steps -> times
    steps: _Curve  # times -> steps

    @classmethod
    def idle(cls, step_s: np.ndarray) -> DecodePace:
        """No prefill anywhere: one step per ``step_s``."""
        zeros = np.zeros((len(step_s), 1))
        return cls.through(zeros, zeros.copy(), step_s)

    @classmethod
    def through(cls, times: np.ndarray, steps: np.ndarray, idle_step_s: np.ndarray) -> DecodePace:
        """The pace through the points (``times``, ``steps``), at one step per
        ``idle_step_s`` outside them."""
        return cls(_Curve(steps, times, idle_step_s), _Curve(times, steps, 1.0 / idle_step_s))

    @classmethod
    def from_timeline(
        cls,
        prefills: tuple[np.ndarray, np.ndarray, np.ndarray],
        waits: tuple[np.ndarray, np.ndarray],
        full_chunk_s: np.ndarray,
        step_s: np.ndarray,
    ) -> DecodePace:
        """``prefills``: per request its prefill's start, end and chunks (disjoint in
        time: one prefill at a time); ``waits``: per request its wait for room in the pool
        (start, end); ``full_chunk_s``: a full chunk's step; ``step_s``: a decode step."""
        starts, ends, chunks = prefills
        count, n = starts.shape
        rate = chunks / np.maximum(ends - starts, 1e-9)  # a prefill's chunk steps a second
        times = np.concatenate([starts, ends, *waits], axis=1)
        zeros, ones = np.zeros((count, n)), np.ones((count, n))
        rate_change = np.concatenate([rate, -rate, zeros, zeros], axis=1)
        wait_change = np.concatenate([zeros, zeros, ones, -ones], axis=1)
        order = np.argsort(times, axis=1, kind="stable")
        times = np.take_along_axis(times, order, axis=1)
        prefill_rate = np.cumsum(np.take_along_axis(rate_change, order, axis=1), axis=1)
        waiting = np.cumsum(np.take_along_axis(wait_change, order, axis=1), axis=1) > 0.5
        idle_rate = (1.0 / step_s)[:, None]
        rate_after = np.where(
            prefill_rate > 1e-12,
            prefill_rate,
            np.where(waiting, (1.0 / full_chunk_s)[:, None], idle_rate),
        )
        rate_before = np.concatenate([idle_rate, rate_after[:, :-1]], axis=1)
        steps = np.cumsum(np.diff(times, axis=1, prepend=0.0) * rate_before, axis=1)
        return cls.through(times, steps, step_s)

    def steps_at(self, at: np.ndarray) -> np.ndarray:
        """Per config, the steps made by time ``at``."""
        return self.steps(at)

    def time_at(self, steps: np.ndarray) -> np.ndarray:
        """Per config, the time by which ``steps`` steps are made."""
        return self.times(steps)


class _Curve:
    """Per row, a piecewise-linear ``ys(xs)`` (``xs`` ascending), at ``slope`` outside."""

    def __init__(self, xs: np.ndarray, ys: np.ndarray, slope: np.ndarray) -> None:
        count, self.width = xs.shape
        self.xs, self.ys, self.slope = xs, ys, slope
        self.rows = np.arange(count)
        self.first, self.last = xs[:, 0], xs[:, -1]
        # One sorted array for every row: each row's points shifted past the previous row's
        # (a point looked up is clipped into its row's range first).
        span = float(np.max(self.last - self.first, initial=0.0)) + 4.0
        self.shift = self.rows * span - self.first + 1.0
        self.flat = (xs + self.shift[:, None]).ravel()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        rows, width, xs, ys = self.rows, self.width, self.xs, self.ys
        inside_x = np.clip(x, self.first - 0.5, self.last + 0.5)
        index = np.searchsorted(self.flat, inside_x + self.shift, side="right") - rows * width
        low = np.clip(index - 1, 0, width - 1)
        high = np.clip(index, 0, width - 1)
        x0, x1, y0, y1 = xs[rows, low], xs[rows, high], ys[rows, low], ys[rows, high]
        inside = (index > 0) & (index < width) & (x1 > x0)
        gradient = np.where(inside, (y1 - y0) / np.where(inside, x1 - x0, 1.0), 0.0)
        between = y0 + (x - x0) * gradient
        after = ys[:, -1] + (x - self.last) * self.slope
        before = ys[:, 0] - (self.first - x) * self.slope
        return np.where(index >= width, after, np.where(index <= 0, before, between))
