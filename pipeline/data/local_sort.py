"""A range prepared inside the feeder: its rows gathered in key order, without a Ray Data pass.

Each unit (a row group holding planned rows) gives its planned rows from the row cache
(`pipeline.data.rowcache`: the group's checked rows, memory-mapped) when it holds them; else from
parquet with the same checks (`read.read_row_group`), either the whole group, written to the
cache first (`fill`: a chapter's preparation), or just the planned rows (a lead-in's small
range, where a cold start should wait for a few steps' rows, not a decode and write of the
corpus). Units are read on a few threads (pyarrow decodes without the GIL). Then each rank's
rows are copied in key order (keys are dense: 0..N-1, rank-major), one slice per row, into
blocks the feeder puts in the object store itself, so it owns them exactly as it owns a Ray
Data pass's blocks. With data.row_cache every range comes here; without it only a lead-in's
ranges of up to `feeder.LOCAL_MAX_TOKENS` real tokens do, and a chapter is sorted by Ray Data
across the cluster (`pipeline.data.sort_pass`).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.data.read import ReadSpec, background_priority, read_row_group, read_unit
from pipeline.data.rowcache import CachedRows, RowCache

__all__ = ["LocalPart", "local_parts", "use_jemalloc"]

log = logging.getLogger("bucketray.data")

# Row groups read at once, each decoded on its own thread (pyarrow releases the GIL): one per
# core, at least 2 so a read waiting on storage overlaps a decode, at most 8 (memory: each
# holds a decoded row group).
READ_THREADS = min(8, max(2, os.cpu_count() or 2))


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
class _Unit:
    """One unit's planned rows (ascending local rows): each row's slice of `values`."""

    values: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    sup: np.ndarray | None
    sids: np.ndarray
    keys: np.ndarray


def _unit_of_table(t: pa.Table, pos: np.ndarray | None, keys: np.ndarray) -> _Unit:
    """Rows `pos` (all when None) of a checked table (`read.read_row_group`'s columns)."""
    col = t["input_ids"].combine_chunks()
    offs = col.offsets.to_numpy()
    sup = t["sup"].combine_chunks().values.to_numpy() if "sup" in t.column_names else None
    sids = t["sample_id"].to_numpy()
    if pos is None:
        return _Unit(col.values.to_numpy(), offs[:-1], offs[1:], sup, sids, keys)
    return _Unit(col.values.to_numpy(), offs[pos], offs[pos + 1], sup, sids[pos], keys)


def _unit_of_cache(c: CachedRows, pos: np.ndarray, keys: np.ndarray) -> _Unit:
    """Rows `pos` of a row group's cached rows (memory-mapped)."""
    return _Unit(c.values, c.offsets[pos], c.offsets[pos + 1], c.sup, c.sample_ids[pos], keys)


def _unit_rows(
    fs: pafs.FileSystem, spec: ReadSpec, units: dict, j: int, cache: RowCache | None, fill: bool
) -> tuple[_Unit, int, str]:
    """Unit j's planned rows, from the row cache when it holds them, else read from parquet:
    the whole row group, checked and cached, when `fill`, else just the planned rows.
    Returns (rows, read retries, source: "cached", "filled" or "parquet")."""
    lo, hi = units["ptr"][j], units["ptr"][j + 1]
    f, g = int(units["file_idx"][j]), int(units["row_group"][j])
    local, keys = units["local_rows"][lo:hi], units["keys"][lo:hi]
    sids, lengths = units["sample_ids"][lo:hi], units["lengths"][lo:hi]
    if cache is not None:
        c = cache.load(f, g)
        pos = None if c is None else c.positions(local)
        if pos is not None:
            u = _unit_of_cache(c, pos, keys)
            if np.array_equal(u.sids, sids) and np.array_equal(u.ends - u.starts, lengths):
                return u, 0, "cached"
        if c is not None:  # rows or lengths the index does not have: read it again
            log.warning(
                "data: row cache file %s does not match the index; dropped", cache.path(f, g)
            )
            cache.drop(f, g)
        if fill:
            rows, all_sids, all_lengths = cache.indexed(f, g)
            zeros = np.zeros(rows.size, np.int64)
            t, retries = read_row_group(fs, spec, f, g, rows, zeros, all_sids, all_lengths)
            # Served from the file just written (pages the kernel may drop), not from the
            # decoded table: a chapter holds the whole corpus decoded otherwise.
            c = cache.load(f, g) if cache.store(f, g, rows, t) else None
            pos = np.searchsorted(rows, local)
            if c is not None:
                return _unit_of_cache(c, pos, keys), retries, "filled"
            # not cached (no room): keep just the planned rows, not the decoded row group
            return _unit_of_table(t.take(pa.array(pos)), None, keys), retries, "parquet"
    t, retries = read_unit(fs, spec, units, j)
    return _unit_of_table(t, None, keys), retries, "parquet"


class _Rows:
    """The units' planned rows laid end to end: which unit holds each, and its slice there."""

    def __init__(self, us: list[_Unit]):
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


def local_parts(
    fs: pafs.FileSystem,
    spec: ReadSpec,
    units: dict,
    rank_rows: np.ndarray,
    rows_per_block: int,
    cache: RowCache | None = None,
    fill: bool = False,
) -> tuple[list[LocalPart], dict]:
    """Per rank: its rows in key order, as blocks of at most `rows_per_block` rows put in the
    object store by this process; and what the reads took: `read_retries`, and the units served
    from the row cache (`rg_cached`), read whole and cached (`rg_filled`, when `fill`) or read
    from parquet (`rg_parquet`); the seconds spent reading units (`read_s`) and copying rows
    into blocks (`gather_s`)."""
    import ray

    t0 = time.perf_counter()
    n = len(units["file_idx"])
    with ThreadPoolExecutor(max(1, min(READ_THREADS, n)), initializer=background_priority) as pool:
        got = list(pool.map(lambda j: _unit_rows(fs, spec, units, j, cache, fill), range(n)))
    sources = [s for _, _, s in got]
    stats = {
        "read_retries": sum(r for _, r, _ in got),
        **{f"rg_{s}": sources.count(s) for s in ("cached", "filled", "parquet")},
    }
    rows = _Rows([u for u, _, _ in got])
    t1 = time.perf_counter()
    order = np.empty(rows.keys.size, dtype=np.int64)
    order[rows.keys] = np.arange(rows.keys.size)  # row holding key k; keys are exactly 0..N-1
    dtype = np.dtype(spec.id_type)
    sup_dtype = None if spec.sup_type is None else np.dtype(spec.sup_type)
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
    stats |= {"read_s": t1 - t0, "gather_s": time.perf_counter() - t1}
    return parts, stats
