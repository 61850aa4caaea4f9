"""A range's rows gathered in key order inside the feeder, into blocks it puts itself.

The units' planned rows (`UnitSlices`: each row a slice of a unit's flat values, from the row
cache's memory-mapped file or from a table read from parquet; which one is decided by
`pipeline.data.prepare`) are copied per rank in key order (keys are dense: 0..N-1, rank-major),
one slice per row, into blocks of at most `rows_per_block` rows that this process puts in the
object store, so the feeder owns them exactly as it owns a Ray Data pass's blocks
(`pipeline.data.sort_pass`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.data.listcolumn import values_offsets
from pipeline.data.rowcache import CachedRows

__all__ = ["LocalPart", "UnitSlices", "gather_parts", "use_jemalloc"]


def use_jemalloc() -> str:
    """Make jemalloc this process's default Arrow memory pool where the pyarrow build has one;
    returns the pool's backend name.

    Measured on 2 cores, a fresh process reading one lead-in (64 row groups of ~80 MB decoded,
    two threads): 6.2-6.7 s with jemalloc, 9.1-9.4 s with the default mimalloc, whose first
    pass over that much memory costs ~40% more CPU (later passes are alike). A feeder reads its
    lead-in exactly once, fresh, so the first pass is the one that counts.
    """
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except (NotImplementedError, pa.ArrowNotImplementedError):  # a build without jemalloc
        pass
    return pa.default_memory_pool().backend_name


class LocalPart:
    """One rank's blocks of a range prepared in the feeder (what a MaterializedDataset gives)."""

    def __init__(self, refs: list, nbytes: int):
        self.refs, self.nbytes = refs, nbytes

    def to_arrow_refs(self) -> list:
        return list(self.refs)

    def size_bytes(self) -> int:
        return self.nbytes


@dataclass
class UnitSlices:
    """One unit's planned rows (ascending local rows): each row's slice of `values`."""

    values: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    sup: np.ndarray | None
    sids: np.ndarray
    keys: np.ndarray

    @classmethod
    def of_table(cls, t: pa.Table, keys: np.ndarray) -> UnitSlices:
        """Every row of a checked table (`read.read_row_group`'s columns)."""
        values, offs = values_offsets(t["input_ids"])
        sup = values_offsets(t["sup"])[0] if "sup" in t.column_names else None
        return cls(values, offs[:-1], offs[1:], sup, t["sample_id"].to_numpy(), keys)

    @classmethod
    def of_cache(cls, c: CachedRows, pos: np.ndarray, keys: np.ndarray) -> UnitSlices:
        """Rows `pos` of a row group's cached rows (memory-mapped)."""
        return cls(c.values, c.offsets[pos], c.offsets[pos + 1], c.sup, c.sample_ids[pos], keys)


class _Rows:
    """The units' planned rows laid end to end: which unit holds each, and its slice there."""

    def __init__(self, us: list[UnitSlices]):
        self.values = [u.values for u in us]
        self.sup = [u.sup for u in us]
        z = np.zeros(0, np.int64)
        self.unit = np.repeat(np.arange(len(us)), [u.keys.size for u in us])
        self.starts = np.concatenate([u.starts for u in us] or [z])
        self.ends = np.concatenate([u.ends for u in us] or [z])
        self.sids = np.concatenate([u.sids for u in us] or [z])
        self.keys = np.concatenate([u.keys for u in us] or [z])

    def gather(self, idx: np.ndarray, dtype, sup_dtype) -> tuple:
        """(values, offsets, supervision) of rows `idx`, each row's slice copied once, in
        that order (one slice per row: a row is hundreds of tokens, so the copies dominate)."""
        starts, ends = self.starts[idx], self.ends[idx]
        spans = list(zip(self.unit[idx].tolist(), starts.tolist(), ends.tolist(), strict=True))
        offsets = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.int64)

        def cat(arrays, dt):
            if not spans:
                return np.zeros(0, dt)
            return np.concatenate([arrays[w][a:b] for w, a, b in spans])

        vals = cat(self.values, dtype)
        sup = None if sup_dtype is None else cat(self.sup, sup_dtype)
        return vals, offsets, sup


def gather_parts(
    units: list[UnitSlices], rank_rows: np.ndarray, rows_per_block: int, dtype, sup_dtype
) -> list[LocalPart]:
    """Per rank: its rows in key order, as blocks of at most `rows_per_block` rows put in the
    object store by this process. `dtype`, `sup_dtype`: the delivered token and supervision
    dtypes (None: no supervision)."""
    import ray

    rows = _Rows(units)
    order = np.empty(rows.keys.size, dtype=np.int64)
    order[rows.keys] = np.arange(rows.keys.size)  # row holding key k; keys are exactly 0..N-1
    starts = np.concatenate([[0], np.cumsum(rank_rows)]).astype(np.int64)
    parts = []
    for a, e in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        refs, nbytes = [], 0
        for lo in range(a, e, max(1, rows_per_block)):
            hi = min(e, lo + rows_per_block)
            idx = order[lo:hi]
            vals, offsets, sup = rows.gather(idx, dtype, sup_dtype)
            off = pa.array(offsets)
            cols = {
                "key": pa.array(np.arange(lo, hi, dtype=np.int64)),
                "sample_id": pa.array(rows.sids[idx], pa.int64()),
                "input_ids": pa.LargeListArray.from_arrays(off, pa.array(vals)),
            }
            if sup is not None:
                cols["sup"] = pa.LargeListArray.from_arrays(off, pa.array(sup))
            block = pa.table(cols)
            refs.append(ray.put(block))
            nbytes += block.nbytes
        parts.append(LocalPart(refs, nbytes))
    return parts
