"""The feeder actor: prepares each epoch's sorted per-rank parts and hands them to the workers.

For epoch e the plan gives every sample a key (rank-major, then step, then slot). A Ray Data pass
reads only the row groups holding planned samples (`pipeline.data.read`), sorts by key across the
cluster with range boundaries at the ranks' row offsets (keys are dense, so no sampling pass is
needed), materializes, and `split_at_indices` cuts one part per rank. The feeder is a named
zero-CPU actor on the driver's node; it owns those blocks and starts epoch e+1 as soon as e is
ready, so the sort overlaps training. Resuming at (e, s) sorts only the plan's tail
(`EpochPlan.slice`). A preparation that failed is dropped, and the next request prepares again.
Ray restarts a dead feeder from its constructor arguments, which hold everything an epoch needs;
its blocks died with it, and the workers ask again (`pipeline.data.stream`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs

from pipeline.core.config import RunConfig
from pipeline.core.epochs import epoch_plan_for
from pipeline.core.plan import EpochPlan, RankView
from pipeline.data.index import LengthIndex, filesystem_for
from pipeline.data.protocol import RankPart
from pipeline.data.read import ReadSpec, plan_read_units, read_units
from pipeline.data.retry import RetryPolicy

__all__ = ["Feeder", "start_feeder", "stop_feeder", "FEEDER_MAX_CONCURRENCY"]

log = logging.getLogger("bucketray.data")

# A part's blocks are sized near this so a worker holds little beyond the micro-batch it pads,
# while per-block overheads (one object fetch, one id check) stay negligible.
TARGET_BLOCK_BYTES = 32 * 1024 * 1024
# Enough threads for every rank's part() call plus the background preparation.
FEEDER_MAX_CONCURRENCY = 64
# Restarts after the feeder process dies (OOM, a killed worker process). Each one costs a
# re-sort of the epoch in flight; a feeder that keeps dying has a cause no restart fixes, and
# once they are used up the workers' requests fail, and the run with them, instead of waiting.
FEEDER_MAX_RESTARTS = 4
SORT_SHUFFLE_STRATEGY = "sort_shuffle_pull_based"
# Handles held by this (driver) process: a named actor without a handle would be reclaimed.
_FEEDERS: dict[str, object] = {}


@dataclass
class _Prepared:
    prep_id: str  # tells a re-preparation of the same key from the one a worker saw fail
    plan_hash: str
    views: list[RankView]
    refs: list[list]  # per rank: ordered block refs of its part
    parts: list  # MaterializedDatasets, kept so their blocks stay alive
    stats: dict


def _note_retries(feeder, key: tuple, n: int) -> None:
    """Called by read tasks: count their retries on the feeder before the task returns."""
    import ray

    ray.get(feeder.note_read_retries.remote(key, n))


class Feeder:
    """Builds and holds each epoch's sorted per-rank parts; see the module docstring."""

    def __init__(
        self,
        cfg: dict,
        index: LengthIndex,
        edges: list[int],
        path: str,
        prefetch: bool = True,
        fs: pafs.FileSystem | None = None,
        retry: RetryPolicy | None = None,
        block_bytes: int = TARGET_BLOCK_BYTES,
    ):
        import ray.data

        self.cfg = RunConfig.model_validate(cfg)
        self.index = index
        self.edges = [int(e) for e in edges]
        self.path = path
        self.prefetch = prefetch
        self.fs = fs if fs is not None else filesystem_for(path)[0]
        self.spec = ReadSpec.of(index, self.cfg.model.vocab_size, retry or RetryPolicy())
        self.block_bytes = int(block_bytes)
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
        self._lock = threading.Lock()
        self._jobs: dict[tuple, Future] = {}
        self._retries: dict[tuple, int] = {}
        # One preparation at a time: two concurrent sorts would only compete for the same CPUs.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="feeder")

    def _submit(self, key: tuple, stale: str | None = None) -> tuple[Future, bool]:
        """(the preparation of `key`, whether this call started it). A failed one, or the one
        with prep_id `stale`, is dropped and started anew."""
        with self._lock:
            fut = self._jobs.get(key)
            if fut is not None and fut.done():
                failed = fut.exception() is not None
                if failed or (stale is not None and fut.result().prep_id == stale):
                    fut = None
            if fut is not None:
                return fut, False
            fut = self._jobs[key] = self._pool.submit(self._prepare, *key)
            return fut, True

    def _prepared(self, key: tuple, stale: str | None = None) -> _Prepared:
        """Wait for `key`'s preparation. One that an earlier request started (a prefetch) and
        that fails is prepared once more for this request: its error may have passed since."""
        fut, fresh = self._submit(key, stale)
        try:
            return fut.result()
        except Exception:
            if fresh:
                raise
            log.warning("data: preparing %s had failed; preparing it again", key, exc_info=True)
            return self._submit(key)[0].result()

    def _prepare(self, epoch: int, world_size: int, start_step: int) -> _Prepared:
        key = (epoch, world_size, start_step)
        t0 = time.perf_counter()
        plan = epoch_plan_for(self.cfg, self.index, self.edges, epoch, world_size)
        full_hash = plan.content_hash
        if start_step:
            plan = plan.slice(start_step)
        keys, rank_rows = plan.sort_keys()
        units = plan_read_units(self.index, plan.sample_ids, keys)
        with self._lock:
            self._retries[key] = 0
        t_plan = time.perf_counter()
        parts: list = []
        refs: list[list] = [[] for _ in range(world_size)]
        if plan.num_samples:
            parts = self._sorted_parts(plan, units, rank_rows, key)
        t_sort = time.perf_counter()
        if parts:
            refs = [p.to_arrow_refs() for p in parts]
        t_split = time.perf_counter()
        with self._lock:
            retries = self._retries.get(key, 0)
        return _Prepared(
            prep_id=uuid.uuid4().hex[:12],
            plan_hash=full_hash,
            views=[plan.rank_view(r) for r in range(world_size)],
            refs=refs,
            parts=parts,
            stats={
                "epoch": epoch,
                "world_size": world_size,
                "start_step": start_step,
                "steps": plan.num_steps,
                "rows_sorted": plan.num_samples,
                "row_groups_read": int(len(units["file_idx"])),
                "read_retries": retries,
                "plan_s": t_plan - t0,
                "sort_s": t_sort - t_plan,
                "split_s": t_split - t_sort,
                "plan_hash": full_hash,
            },
        )

    def _sorted_parts(self, plan: EpochPlan, units: dict, rank_rows: np.ndarray, key: tuple):
        """Read the planned rows, sort them by key, materialize, split per rank."""
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
                "fs": self.fs,
                "units_ref": [ray.put(units)],
                "spec": self.spec,
                "on_retries": functools.partial(_note_retries, me, key),
            },
        )
        ds = ds.sort("key", boundaries=self._boundaries(plan, rank_rows)).materialize()
        cuts = [int(c) for c in np.cumsum(rank_rows)[:-1]]
        return ds.split_at_indices(cuts) if cuts else [ds]

    def _boundaries(self, plan: EpochPlan, rank_rows: np.ndarray) -> list[int]:
        """Range-partition boundaries: every rank start, plus cuts for ~block_bytes blocks.

        Keys are 0..N-1, so these are exact and the sort needs no sampling pass.
        """
        bytes_per_row = 4 * float(plan.lengths.mean()) + 32
        rows_per_block = max(1, int(self.block_bytes // bytes_per_row))
        starts = np.concatenate([[0], np.cumsum(rank_rows)])
        cuts = [
            np.arange(s, e, rows_per_block) for s, e in zip(starts[:-1], starts[1:], strict=True)
        ]
        b = np.unique(np.concatenate([*cuts, starts[1:-1]]).astype(np.int64))
        return [int(x) for x in b if 0 < x < plan.num_samples]

    def prepare(self, epoch: int, world_size: int, start_step: int = 0) -> dict:
        """Prepare (or wait for) the parts of (epoch, world_size, start_step); returns timings."""
        return self._prepared((epoch, world_size, start_step)).stats

    def part(
        self, epoch: int, world_size: int, start_step: int, rank: int, stale: str | None = None
    ) -> RankPart:
        """Rank `rank`'s part; starts preparing epoch + 1. `stale`: a prep_id whose blocks a
        worker found lost, prepared again instead of handed out a second time."""
        prep = self._prepared((epoch, world_size, start_step), stale)
        if self.prefetch and epoch + 1 < self.cfg.train.epochs:  # no sort nobody will read
            self._submit((epoch + 1, world_size, 0))
        with self._lock:  # parts of older epochs are released (workers still reading hold refs)
            for k in [k for k in self._jobs if k[0] < epoch]:
                del self._jobs[k]
        return RankPart(
            epoch=epoch,
            world_size=world_size,
            start_step=start_step,
            rank=rank,
            prep_id=prep.prep_id,
            plan_hash=prep.plan_hash,
            view=prep.views[rank],
            refs=tuple(prep.refs[rank]),
            edges=tuple(self.edges),
            pad_id=self.cfg.data.pad_id,
            pad_to_multiple_of=self.cfg.batching.pad_to_multiple_of,
            supervision=self.index.supervision,
            read_retries=prep.stats["read_retries"],
        )

    def note_read_retries(self, key: tuple, n: int) -> None:
        """Read tasks report the transient errors they retried (see `pipeline.data.retry`)."""
        with self._lock:
            self._retries[tuple(key)] = self._retries.get(tuple(key), 0) + n
        log.warning("data: retried %d transient read error(s) preparing %s", n, tuple(key))

    def status(self) -> list[dict]:
        """Stats of finished preparations, and the key and state of the others."""
        with self._lock:
            jobs = dict(self._jobs)
        out = []
        for k, f in sorted(jobs.items()):
            if f.done() and f.exception() is None:
                out.append(f.result().stats)
            else:  # running, or failed (prepared again on the next request)
                err = f.exception() if f.done() else None
                out.append(
                    {"key": k, "done": f.done(), "error": None if err is None else repr(err)}
                )
        return out


def start_feeder(
    cfg: RunConfig,
    index: LengthIndex,
    edges: list[int],
    *,
    name: str,
    path: str,
    prefetch: bool = True,
    filesystem: pafs.FileSystem | None = None,
    retry: RetryPolicy | None = None,
    block_bytes: int = TARGET_BLOCK_BYTES,
):
    """Start the named zero-CPU feeder actor on this (the driver's) node; returns its handle.

    The driver process keeps a handle, so the actor lives until `stop_feeder(name)`, a new
    feeder of the same name, or the end of the driver (a non-detached actor dies with its job).
    `filesystem` defaults to the one `path` names; `retry` is the policy for transient read
    errors; `block_bytes` the target size of a part's blocks.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    stop_feeder(name)
    actor_cls = ray.remote(
        num_cpus=0,
        max_concurrency=FEEDER_MAX_CONCURRENCY,
        max_restarts=FEEDER_MAX_RESTARTS,
        # A part() call cut short by a restart runs again on the new feeder: it only prepares.
        max_task_retries=-1,
    )(Feeder)
    node = ray.get_runtime_context().get_node_id()
    handle = actor_cls.options(
        name=name, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    ).remote(
        cfg.model_dump(mode="json"),
        index,
        list(edges),
        path,
        prefetch,
        # Resolved here so the actor reads with the driver's endpoint (AWS_ENDPOINT_URL), as the
        # index scan does; a pickled filesystem carries the endpoint, never the credentials.
        filesystem if filesystem is not None else filesystem_for(path)[0],
        retry,
        block_bytes,
    )
    _FEEDERS[name] = handle
    return handle


def stop_feeder(name: str) -> None:
    """Kill the named feeder (if any, and for good), releasing the epochs it holds."""
    import ray

    _FEEDERS.pop(name, None)
    try:
        ray.kill(ray.get_actor(name), no_restart=True)
    except ValueError:
        pass
