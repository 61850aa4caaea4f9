"""Two runs' held-out curves compared at equal real tokens and at equal training time (pure
numpy): where a run stands against a reference, in numbers a verdict line states.

Runs that batch differently take different numbers of steps for the same tokens, so points are
matched on real tokens trained (or seconds of training steps), never on steps. A curve is read
between its evaluations by linear interpolation, and never past its last one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["Standing", "Curve", "standing", "reached_at"]

TREND_POINTS = 3  # the last evaluations the trend of the difference is read over


@dataclass(frozen=True)
class Curve:
    """A held-out curve: loss at each evaluation, against an increasing x (tokens or seconds)."""

    x: np.ndarray
    loss: np.ndarray

    @classmethod
    def of(cls, x, loss) -> Curve:
        x, y = np.asarray(x, np.float64), np.asarray(loss, np.float64)
        ok = np.isfinite(x) & np.isfinite(y)
        order = np.argsort(x[ok], kind="stable")
        return cls(x[ok][order], y[ok][order])

    def at(self, x: float) -> float:
        """The loss at `x` (interpolated), NaN outside the evaluated range."""
        if self.x.size == 0 or x < self.x[0] or x > self.x[-1]:
            return float("nan")
        return float(np.interp(x, self.x, self.loss))


@dataclass(frozen=True)
class Standing:
    """A run against a reference on one axis. `diff` < 0: the run's held-out loss is lower."""

    at: float  # the last common x
    run: float  # the run's held-out loss there
    reference: float  # the reference's
    diff: float  # run - reference
    trend: float  # change of diff over the run's last TREND_POINTS common points (< 0: gaining)

    def to_dict(self) -> dict:
        return asdict(self)


def standing(run: Curve, ref: Curve) -> Standing | None:
    """The run against the reference at their last common x (the smaller of their last
    evaluations), and the trend of the difference over the run's last common evaluations;
    None where the curves share no range."""
    if run.x.size == 0 or ref.x.size == 0:
        return None
    end = min(run.x[-1], ref.x[-1])
    start = max(run.x[0], ref.x[0])
    if end < start:
        return None
    a, b = run.at(end), ref.at(end)
    xs = np.unique(np.append(run.x[(run.x >= start) & (run.x < end)], end))
    xs = xs[xs > 0][-TREND_POINTS:]  # the untrained point says nothing about a trend
    diffs = [run.at(x) - ref.at(x) for x in xs]
    trend = float(diffs[-1] - diffs[0]) if len(diffs) >= 2 else float("nan")
    return Standing(float(end), a, b, a - b, trend)


def reached_at(run: Curve, target: float) -> float:
    """The first x at which the run's held-out loss reached `target` (interpolated between
    evaluations), NaN if it never did."""
    below = np.flatnonzero(run.loss <= target)
    if below.size == 0:
        return float("nan")
    i = int(below[0])
    if i == 0:
        return float(run.x[0])
    x0, x1, y0, y1 = run.x[i - 1], run.x[i], run.loss[i - 1], run.loss[i]
    return float(x0 + (x1 - x0) * (y0 - target) / (y0 - y1)) if y0 != y1 else float(x1)
