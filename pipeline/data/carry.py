"""A windowed epoch's carried rows, held from one window's Ray Data pass to the next.

Each row group is in one window (`pipeline.core.windows`), and a window trains the rows of its
row groups except the few a later window trains (`windows.carried_rows`: usually the next; a
bucket with less than a batch in a window carries on, and a window may train nothing). A
window's pass therefore reads its own row groups once: the rows it trains, plus the rows it
carries out (every row read so far that a later window trains: read now, or taken from what is
held), keyed past the end of its own rows, sorted into one more part and held here for the next
window that trains a step; that window's pass takes the rows it trains from here, re-keyed to
their places, and carries the rest on, instead of reading their row groups again. Where nothing
is held (a fresh feeder after a resume, a lead-in before), the carried-in rows are read from
their row groups like any other.

`CarryBook.plan_range` decides, per range, which of its rows come from what is held and which
rows it carries out; the preparer runs the pass and `keep`s the carried part.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.core.plan import EpochPlan
from pipeline.core.windows import carried_rows, trained_windows

__all__ = ["CarryBook", "RangeCarry", "rekey"]


@dataclass(frozen=True, eq=False)
class RangeCarry:
    """How one range of a windowed epoch meets the carry: `held` (rows of the range taken from
    the held part: a mask over the range's rows), the held part itself, the sample ids the range
    carries out (keyed after its rows) and which of them come from the held part (`out_held`;
    the others are read with the range); its window, and the window its carried part goes into."""

    held: np.ndarray
    part: object | None
    out_sids: np.ndarray
    window: int
    out_held: np.ndarray | None = None
    into: int = -1

    @property
    def num_held(self) -> int:
        return int(self.held.sum())


class _EpochRows:
    """A windowed epoch's rows: the window that reads each (by its row group), the window
    that trains it, and which are carried."""

    def __init__(self, plan: EpochPlan, read_window: np.ndarray):
        self.read = read_window
        self.trained = trained_windows(plan)
        self.carried = carried_rows(plan, read_window, self.trained)


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
        w = int(trained_windows(full, np.array([start]))[0])
        lo = int(full.step_offsets[start - full.first_step])
        hi = int(full.step_offsets[end - full.first_step])
        held_part = self._held.get((full.epoch, w))
        held = np.zeros(hi - lo, dtype=bool)
        out, into = np.zeros(0, dtype=np.int64), -1
        if held_part is not None:
            held = rows.carried[lo:hi] & np.isin(full.sample_ids[lo:hi], held_part[1])
        if end == int(ws[w + 1]) and end < int(ws[-1]):  # the window's end, not the epoch's
            into = int(trained_windows(full, np.array([end]))[0])
            out = full.sample_ids[(rows.read < into) & (rows.trained >= into)]
        out_held = np.zeros(out.size, dtype=bool)
        if held_part is not None:
            out_held = np.isin(out, held_part[1])
        part = None if held_part is None else held_part[0]
        return RangeCarry(held, part, out, w, out_held, into)

    def keep(self, epoch: int, window: int, part, sids: np.ndarray, since: int) -> None:
        """Hold `part` (rows `sids`) for window `window` of `epoch`, the next to train a step
        after window `since`; forget what went into a window before `since` (what went into
        `since` is kept, for a retried preparation)."""
        self._held[(epoch, window)] = (part, np.asarray(sids, dtype=np.int64))
        for k in [k for k in self._held if k < (epoch, since)]:
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
