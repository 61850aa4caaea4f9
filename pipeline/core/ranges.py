"""Which range of an epoch each request is served: chapters from the config, lead-ins, positions.

The feeder serves an epoch as consecutive ranges of global steps. This module decides them,
purely (no I/O, no Ray), so the feeder and the benchmarks that predict what it reads make the
same decisions:

- chapter bounds from the config (`chapter_bounds_for`: delivery.chapter_tokens and chapter_steps,
  cut on the full epoch's plan so a resume keeps them; the cutting itself is
  `pipeline.core.chapters`);
- a lead-in (`lead_in_bounds`, delivery.lead_tokens): a chapter is too long to wait for at a start
  (its sort takes tens of seconds), so where a request does not continue a decided range (a cold
  start, a resume) the first range served holds at most delivery.lead_tokens real tokens, then ranges
  `LEAD_GROWTH` times larger each, up to the end of the chapter holding the start step; the
  regular chapters follow. A lead-in is a few more cuts of the same plan, so the order and the
  hash are the epoch's; each of its ranges reads nearly every row group, which is the price of
  an early first step (time to the first step and reads per epoch: BENCHMARKS.md, section 4);
- each range's end, decided once per (epoch, world size, start step) and given to every rank
  and every retry (`RangeBook`, `RangeDecisions.end_for`);
- where each rank is (`RankPositions`): a range every rank has moved past is needed by none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.core.chapters import chapter_end, chapter_of, plan_chapter_bounds, step_tokens
from pipeline.core.plan import EpochPlan

if TYPE_CHECKING:
    from pipeline.core.deliveryconfig import DeliveryConfig

__all__ = [
    "LEAD_GROWTH",
    "EpochRanges",
    "RangeBook",
    "RangeDecisions",
    "RankPositions",
    "chapter_bounds_for",
    "lead_in_bounds",
]

# Each range of a lead-in holds this many times the real tokens of the one before.
LEAD_GROWTH = 4
# Epochs whose plans and decided ranges are remembered (the one served and the next, prepared
# ahead); an older one is forgotten.
KEEP_EPOCHS = 2


def chapter_bounds_for(plan: EpochPlan, delivery: DeliveryConfig) -> np.ndarray:
    """The chapter boundaries the config asks for (delivery.chapter_steps, chapter_tokens), or a
    windowed epoch's windows (each window is a chapter: its row groups are read with it); pass
    the full epoch's plan so a resume keeps them."""
    if plan.window_steps is not None:  # an empty window is no chapter
        return np.unique(np.asarray(plan.window_steps, dtype=np.int64))
    return plan_chapter_bounds(
        plan, max_steps=delivery.chapter_steps, max_tokens=delivery.chapter_tokens
    )


def lead_in_bounds(
    tokens: np.ndarray,
    bounds: np.ndarray,
    start: int,
    lead_tokens: int,
    *,
    growth: int = LEAD_GROWTH,
    first_step: int = 0,
) -> np.ndarray:
    """Cuts [start, c1, ..., end] (absolute steps) of a lead-in: the ranges served from `start`
    when nothing is prepared there (a cold start, a resume), up to the end of the chapter holding
    `start`. The first range holds at most `lead_tokens` real tokens, each next one at most
    `growth` times the one before (every range at least one step), so the first step waits for a
    small preparation and the ranges soon reach the regular chapters' size.

    `tokens`: each step's real tokens (`step_tokens` of the full plan, whose first step is
    `first_step`); `bounds`: the regular chapter boundaries. A pure function of its arguments:
    every rank, and a restarted feeder, computes the same cuts.
    """
    if lead_tokens < 1 or growth < 1:
        raise ValueError(f"lead_tokens and growth must be >= 1, got {lead_tokens}, {growth}")
    b = np.asarray(bounds, dtype=np.int64)
    end = chapter_end(b, start)
    t = np.asarray(tokens, dtype=np.int64)[start - first_step : end - first_step]
    cum = np.concatenate([[0], np.cumsum(t)])  # tokens from `start` to each step
    cuts, at, size = [0], 0, int(lead_tokens)
    while at < t.size:
        # the furthest step whose tokens from `at` stay within `size`, at least one step on
        nxt = int(np.searchsorted(cum, cum[at] + size, side="right")) - 1
        at = min(max(nxt, at + 1), t.size)
        cuts.append(at)
        size *= growth
    return np.asarray(cuts, dtype=np.int64) + start


@dataclass(frozen=True)
class EpochRanges:
    """One epoch's full plan and the chapter bounds the config cuts it into."""

    plan: EpochPlan
    bounds: np.ndarray

    @classmethod
    def of(cls, plan: EpochPlan, delivery: DeliveryConfig) -> EpochRanges:
        return cls(plan, chapter_bounds_for(plan, delivery))

    @property
    def num_steps(self) -> int:
        return self.plan.num_steps

    @property
    def num_chapters(self) -> int:
        return int(self.bounds.size - 1)

    def chapter_end(self, start: int) -> int:
        """End of the chapter holding `start` (the epoch's end for `start` at the end)."""
        return chapter_end(self.bounds, start)

    def chapter_of(self, start: int) -> int:
        """Index of the chapter holding `start`; -1 at the epoch's end."""
        return chapter_of(self.bounds, start) if start < self.num_steps else -1

    def lead_in(self, start: int, lead_tokens: int) -> np.ndarray:
        """`lead_in_bounds` from `start`: the cuts of a lead-in up to its chapter's end."""
        tokens = step_tokens(self.plan)
        return lead_in_bounds(
            tokens, self.bounds, start, lead_tokens, first_step=self.plan.first_step
        )

    def is_lead_in(self, start: int, end: int) -> bool:
        """Whether [start, end) is a lead-in's range: it ends before its chapter does."""
        return end < self.chapter_end(start) if start < self.num_steps else False


class RankPositions:
    """Where each rank of one world size last said it is, as (epoch, step): a chapter ending at
    or before every rank's position is needed by none of them. A new world size starts afresh
    (a resized run restarts every rank)."""

    def __init__(self):
        self.world_size = 0
        self._pos: dict[int, tuple[int, int]] = {}

    def move(self, epoch: int, world_size: int, step: int, rank: int) -> None:
        if world_size != self.world_size:
            self.world_size, self._pos = world_size, {}
        self._pos[rank] = (epoch, step)

    def passed(self, epoch: int, step: int) -> bool:
        """Every rank has said it is at (epoch, step) or beyond."""
        if len(self._pos) < self.world_size or not self._pos:
            return False
        return min(self._pos.values()) >= (epoch, step)


class RangeBook:
    """The ranges decided so far per (epoch, world size): start step -> end step, each decided
    once (every rank, and a retry, gets the same end), and the steps where a decided range ends:
    a request there continues a stream and gets no lead-in. The last range of an epoch leads to
    step 0 of the next."""

    def __init__(self):
        self._ends: dict[tuple[int, int], dict[int, int]] = {}
        self._follows: set[tuple[int, int, int]] = set()

    def end(self, epoch: int, world_size: int, start: int) -> int | None:
        return self._ends.get((epoch, world_size), {}).get(start)

    def continues(self, epoch: int, world_size: int, start: int) -> bool:
        return (epoch, world_size, start) in self._follows

    def record(self, epoch: int, world_size: int, cuts, epoch_steps: int) -> int:
        """Record the ranges between consecutive `cuts`, keeping any decided earlier from the
        same start; returns the end decided for cuts[0]."""
        ends = self._ends.setdefault((epoch, world_size), {})
        c = [int(x) for x in cuts]
        for a, b in zip(c[:-1], c[1:], strict=True):
            if ends.setdefault(a, b) == b:
                nxt = (epoch, world_size, b) if b < epoch_steps else (epoch + 1, world_size, 0)
                self._follows.add(nxt)
        return ends[c[0]]

    def forget(self, epoch: int, world_size: int) -> None:
        """Drop what was decided for (epoch, world_size)."""
        self._ends.pop((epoch, world_size), None)
        self._follows = {f for f in self._follows if f[:2] != (epoch, world_size)}


class RangeDecisions:
    """The ranges served for each (epoch, world size): the epochs' plans and chapter bounds
    (remembered for `KEEP_EPOCHS` epochs), and each range's end, decided once. Thread-safe: a
    feeder's requests arrive on many threads; one thread plans an epoch while the others wait.

    `plan_for(epoch, world_size)` plans an epoch (`pipeline.core.epochs.epoch_plan_for` over the
    run's config, index and edges); `delivery` is the run's delivery section.
    """

    def __init__(self, plan_for: Callable[[int, int], EpochPlan], delivery: DeliveryConfig):
        if delivery.lead_tokens == "auto":
            raise ValueError(
                "RangeDecisions takes a decided delivery section (RunConfig.delivery_used)"
            )
        self._plan_for = plan_for
        self._delivery = delivery
        self._epochs: dict[tuple[int, int], EpochRanges] = {}
        self._epoch_lock = threading.Lock()  # planning an epoch takes a while: not under _lock
        self._lock = threading.Lock()
        self._book = RangeBook()

    def epoch(self, epoch: int, world_size: int) -> EpochRanges:
        """The epoch's plan and chapter bounds (of the full plan, so a resume keeps them)."""
        key = (epoch, world_size)
        with self._epoch_lock:
            if key not in self._epochs:
                self._epochs[key] = EpochRanges.of(
                    self._plan_for(epoch, world_size), self._delivery
                )
                # the oldest others go, never the one asked for (an earlier epoch asked again)
                others = sorted(k for k in self._epochs if k != key)
                for k in others[: max(0, len(others) + 1 - KEEP_EPOCHS)]:
                    del self._epochs[k]
                    with self._lock:
                        self._book.forget(*k)
            return self._epochs[key]

    def decided(self, epoch: int, world_size: int, start: int) -> bool:
        """Whether a range from `start` was decided."""
        with self._lock:
            return self._book.end(epoch, world_size, start) is not None

    def end_for(
        self, epoch: int, world_size: int, start: int, end: int | None, *, may_lead: bool
    ) -> int:
        """The end step of the range served from `start`, the same for every rank.

        `end`, when given (a worker asking again for the range it had), is kept. Otherwise the
        range decided earlier for `start`; else, for a worker's request (`may_lead`) that does
        not continue a decided range (a cold start, a resume), the first range of a lead-in
        (`lead_in_bounds`, delivery.lead_tokens), whose later cuts are decided with it; else the
        end of the chapter holding `start`.
        """
        er = self.epoch(epoch, world_size)
        steps = er.num_steps
        if start >= steps:
            return start
        with self._lock:
            decided = self._book.end(epoch, world_size, start)
            if end is not None or decided is not None:
                self._book.record(epoch, world_size, [start, end or decided], steps)
                return end or decided
            follows = self._book.continues(epoch, world_size, start)
        lead = self._delivery.lead_tokens if may_lead and not follows else None
        cuts = er.lead_in(start, lead) if lead else [start, er.chapter_end(start)]
        with self._lock:
            return self._book.record(epoch, world_size, cuts, steps)
