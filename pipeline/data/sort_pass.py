"""A chapter's Ray Data pass: read the row groups holding its rows, sort by key, split per rank.

One task per (file, row group) reads the planned rows with their keys (`pipeline.data.read`);
the sort uses range boundaries at the ranks' row offsets plus cuts for blocks of about the
feeder's block size (keys are dense, 0..N-1, so the boundaries are exact and no sampling pass
is needed); the result is materialized and `split_at_indices` cuts one part per rank. Its blocks
belong to the process that runs the pass: the feeder.
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow.fs as pafs

from pipeline.core.plan import EpochPlan
from pipeline.data.read import ReadSpec, read_units

__all__ = ["rows_per_block", "range_boundaries", "sorted_parts"]


def _note_retries(feeder, key: tuple, n: int) -> None:
    """Called by read tasks: count their retries on the feeder before the task returns."""
    import ray

    ray.get(feeder.note_read_retries.remote(key, n))


def rows_per_block(plan: EpochPlan, block_bytes: int) -> int:
    """Rows of about `block_bytes` (int32 ids plus the key, sample id and offsets)."""
    bytes_per_row = 4 * float(plan.lengths.mean()) + 32
    return max(1, int(block_bytes // bytes_per_row))


def range_boundaries(plan: EpochPlan, rank_rows: np.ndarray, block_rows: int) -> list[int]:
    """Range-partition boundaries: every rank start, plus cuts every `block_rows` rows."""
    starts = np.concatenate([[0], np.cumsum(rank_rows)])
    cuts = [np.arange(s, e, block_rows) for s, e in zip(starts[:-1], starts[1:], strict=True)]
    b = np.unique(np.concatenate([*cuts, starts[1:-1]]).astype(np.int64))
    return [int(x) for x in b if 0 < x < plan.num_samples]


def sorted_parts(
    fs: pafs.FileSystem,
    spec: ReadSpec,
    plan: EpochPlan,
    units: dict,
    rank_rows: np.ndarray,
    block_rows: int,
    key: tuple,
) -> list:
    """Read the planned rows, sort them by key, materialize, split per rank; read retries are
    reported to the calling feeder actor under `key`."""
    import ray
    import ray.data

    items = [
        {"u": j, "file_idx": int(f), "row_group": int(g)}
        for j, (f, g) in enumerate(zip(units["file_idx"], units["row_group"], strict=True))
    ]
    me = ray.get_runtime_context().current_actor
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        read_units,
        batch_size=1,
        batch_format="pyarrow",
        fn_kwargs={
            "fs": fs,
            "units_ref": [ray.put(units)],
            "spec": spec,
            "on_retries": functools.partial(_note_retries, me, key),
        },
    )
    ds = ds.sort("key", boundaries=range_boundaries(plan, rank_rows, block_rows)).materialize()
    cuts = [int(c) for c in np.cumsum(rank_rows)[:-1]]
    return ds.split_at_indices(cuts) if cuts else [ds]
