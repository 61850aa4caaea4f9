"""A small range prepared inside the feeder: read, key-order and cut without a Ray Data pass.

A lead-in's first ranges hold a few steps, yet their samples sit in nearly every row group, so
their preparation is all reading: one small read per row group, then a sort of a few thousand
rows. Through Ray Data each such preparation also pays the executor's start-up, one task per
row group and a distributed sort, which on a loaded machine costs tens of seconds. Here the
feeder reads the same units with the same checks (`read.read_unit`) on a few threads
(pyarrow decodes without the GIL), puts each rank's rows in key order (keys are dense:
0..N-1, rank-major) and puts its blocks in the object store itself, so it owns them exactly as
it owns a Ray Data pass's blocks. Only ranges up to `feeder.LOCAL_MAX_TOKENS` real tokens come
here: a larger chapter is sorted by Ray Data across the cluster.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.data.read import ReadSpec, background_priority, read_unit

__all__ = ["LocalPart", "local_parts", "use_jemalloc"]

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


def _read_all(fs: pafs.FileSystem, spec: ReadSpec, units: dict) -> tuple[pa.Table, int]:
    """Every unit's planned rows, keyed (unit order); and the read retries they took."""
    n = len(units["file_idx"])
    with ThreadPoolExecutor(max(1, min(READ_THREADS, n)), initializer=background_priority) as pool:
        got = list(pool.map(lambda j: read_unit(fs, spec, units, j), range(n)))
    return pa.concat_tables([t for t, _ in got]), sum(r for _, r in got)


def local_parts(
    fs: pafs.FileSystem, spec: ReadSpec, units: dict, rank_rows: np.ndarray, rows_per_block: int
) -> tuple[list[LocalPart], int]:
    """Per rank: its rows in key order, as blocks of at most `rows_per_block` rows put in the
    object store by this process; and the read retries it took."""
    import ray

    table, retries = _read_all(fs, spec, units)
    keys = table["key"].to_numpy()
    order = np.empty(keys.size, dtype=np.int64)
    order[keys] = np.arange(keys.size)  # row holding key k; keys are exactly 0..N-1
    starts = np.concatenate([[0], np.cumsum(rank_rows)]).astype(np.int64)
    parts = []
    for a, e in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        refs, nbytes = [], 0
        for lo in range(a, e, max(1, rows_per_block)):
            block = table.take(pa.array(order[lo : min(e, lo + rows_per_block)]))
            refs.append(ray.put(block))
            nbytes += block.nbytes
        parts.append(LocalPart(refs, nbytes))
    return parts, retries
