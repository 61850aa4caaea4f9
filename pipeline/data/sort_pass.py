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
from pipeline.data.carry import rekey
from pipeline.data.read import ReadSpec, ReadUnits, read_units

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


SORT_SHUFFLE_STRATEGY = "sort_shuffle_pull_based"


@functools.cache
def _configure_data_context() -> None:
    """Set this process's Ray Data context for keyed sorts, once (done at the first sort, so a
    feeder that only reads a lead-in never imports Ray Data)."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    # Keys fix the order; preserve_order also keeps block order independent of scheduling.
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    # Measured on 2 cores with Ray 2.60: the default (shuffle_v2) adds ~5 s of fixed
    # start-up to every sort, the pull-based sort shuffle ~0.1 s; with range boundaries
    # given, the sort is a single map-partition / reduce-merge pass either way.
    ctx.shuffle_strategy = SORT_SHUFFLE_STRATEGY
    # A read task's DataError (naming file, row group and sample) or StorageUnavailableError
    # reaches the worker as itself, not as Ray Data's generic "UDF failed" wrapper.
    ctx.raise_original_map_exception = True


def sorted_parts(
    fs: pafs.FileSystem,
    spec: ReadSpec,
    plan: EpochPlan,
    units: ReadUnits,
    rank_rows: np.ndarray,
    block_rows: int,
    key: tuple,
    held: tuple | None = None,
    carry_out: int = 0,
) -> list:
    """Read the planned rows, sort them by key, materialize, split per rank; read retries are
    reported to the calling feeder actor under `key`. A windowed epoch's range also takes rows
    from `held` (a part held from the window before, the sample ids it gives and their keys:
    `pipeline.data.carry`) and, with `carry_out`, sorts the rows keyed after its own into one
    more part, the last."""
    import ray
    import ray.data

    _configure_data_context()
    items = [{"u": j} for j in range(len(units))]  # one read task per unit
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
    if held is not None:
        part, sids, keys = held
        ds = ds.union(
            part.map_batches(rekey, batch_format="pyarrow", fn_kwargs={"sids": sids, "keys": keys})
        )
    bounds = range_boundaries(plan, rank_rows, block_rows)
    cuts = [int(c) for c in np.cumsum(rank_rows)[:-1]]
    if carry_out:
        bounds, cuts = [*bounds, plan.num_samples], [*cuts, plan.num_samples]
    ds = ds.sort("key", boundaries=bounds).materialize()
    return ds.split_at_indices(cuts) if cuts else [ds]
