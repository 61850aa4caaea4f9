"""A windowed epoch's carried rows, held from one window's Ray Data pass to the next.

Each row group is in one window (`pipeline.core.windows`), and a window trains the rows of its
row groups except the few it carries into the next window (`windows.carried_rows`). A window's
pass therefore reads its own row groups once: the rows it trains, plus the rows it carries out,
which are keyed past the end of its own rows, sorted into one more part and held here; the next
window's pass takes them from here, re-keyed to their places, instead of reading their row groups
again. Where nothing is held (a fresh feeder after a resume, a lead-in before), the carried-in
rows are read from their row groups like any other.

`CarryBook.plan_range` decides, per range, which of its rows come from what is held and which
rows it carries out; the preparer runs the pass and `keep`s the carried part.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.core.plan import EpochPlan
from pipeline.core.windows import carried_rows

__all__ = ["CarryBook", "RangeCarry", "rekey"]


@dataclass(frozen=True, eq=False)
class RangeCarry:
    """How one range of a windowed epoch meets the carry: `held` (rows of the range taken from
    the held part: a mask over the range's rows), the held part itself and its sample ids, and
    the sample ids the range carries out (read with it, keyed after its rows)."""

    held: np.ndarray
    part: object | None
    out_sids: np.ndarray
    window: int

    @property
    def num_held(self) -> int:
        return int(self.held.sum())


class _EpochRows:
    """A windowed epoch's rows: the window that reads each (by its row group), the window
    that trains it, and which are carried."""

    def __init__(self, plan: EpochPlan, read_window: np.ndarray):
        self.read = read_window
        self.carried = carried_rows(plan, read_window)
        step = np.repeat(np.arange(plan.num_steps), np.diff(plan.step_offsets)) + plan.first_step
        self.trained = np.searchsorted(plan.window_steps, step, side="right") - 1


class CarryBook:
    """The carried parts held between windows' passes, per (epoch, window they go into)."""

    def __init__(self, windows_of: Callable[[int], np.ndarray], index_ids: np.ndarray):
        self._windows_of = windows_of  # epoch -> each index position's window
        self._ids = index_ids
        self._rows: dict[tuple, _EpochRows] = {}
        self._held: dict[tuple[int, int], tuple[object, np.ndarray]] = {}

    def _epoch_rows(self, full: EpochPlan) -> _EpochRows:
        key = (full.epoch, full.content_hash)
        if key not in self._rows:
            pos = np.searchsorted(self._ids, full.sample_ids)
            self._rows = {key: _EpochRows(full, self._windows_of(full.epoch)[pos])}
        return self._rows[key]

    def plan_range(self, full: EpochPlan, start: int, end: int) -> RangeCarry | None:
        """What range [start, end) of `full` (an epoch's whole plan) takes from the held part
        and carries out; None for an epoch of one window."""
        if full.window_steps is None:
            return None
        rows = self._epoch_rows(full)
        ws = full.window_steps
        w = int(np.searchsorted(ws, start, side="right") - 1)
        lo = int(full.step_offsets[start - full.first_step])
        hi = int(full.step_offsets[end - full.first_step])
        held_part = self._held.get((full.epoch, w))
        held = np.zeros(hi - lo, dtype=bool)
        if held_part is not None:
            held = rows.carried[lo:hi] & np.isin(full.sample_ids[lo:hi], held_part[1])
        out = np.zeros(0, dtype=np.int64)
        if end == int(ws[w + 1]) and w + 1 < ws.size - 1:
            out = full.sample_ids[rows.carried & (rows.read == w)]
        return RangeCarry(held, None if held_part is None else held_part[0], out, w)

    def keep(self, epoch: int, window: int, part, sids: np.ndarray) -> None:
        """Hold `part` (rows `sids`) for window `window` of `epoch`; forget what went into an
        earlier window (the one before is kept, for a retried preparation)."""
        self._held[(epoch, window)] = (part, np.asarray(sids, dtype=np.int64))
        for k in [k for k in self._held if k < (epoch, window - 1)]:
            del self._held[k]

    def forget(self, epoch: int, window: int) -> None:
        """Drop what is held for `window` of `epoch` (lost: its rows are read again)."""
        self._held.pop((epoch, window), None)

    def held_bytes(self) -> int:
        return int(sum(p.size_bytes() for p, _ in self._held.values()))


def rekey(batch: pa.Table, sids: np.ndarray, keys: np.ndarray) -> pa.Table:
    """Ray Data `map_batches` function: the held rows whose sample id is in `sids`, each given
    its key in the range taking it (`keys`, aligned with `sids`); the others dropped."""
    s = batch["sample_id"].to_numpy()
    order = np.argsort(sids)
    pos = np.minimum(np.searchsorted(sids[order], s), max(sids.size - 1, 0))
    found = sids[order][pos] == s if sids.size else np.zeros(s.size, dtype=bool)
    batch = batch.filter(pa.array(found))
    new = pa.array(keys[order][pos[found]], pa.int64())
    return batch.set_column(batch.schema.get_field_index("key"), "key", new)
