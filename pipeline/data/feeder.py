"""The feeder actor: prepares each chapter's sorted per-rank parts and hands them to the workers.

An epoch's global steps are cut into chapters (`pipeline.core.chapters`: at most
data.chapter_tokens real tokens or data.chapter_steps steps each), and each chapter is prepared on
its own: its plan (the epoch's, restricted to its steps) gives every sample a key (rank-major,
then step, then slot). With data.row_cache (default) the feeder copies each rank's rows in key
order out of the row cache (`pipeline.data.rowcache`: each row group decoded and checked once
into a memory-mapped file on this node, filled by the first chapter that needs it) into blocks
it puts itself (`pipeline.data.local_sort`). Without it a Ray Data pass
(`pipeline.data.sort_pass`) reads only the row groups holding the chapter's samples
(`pipeline.data.read`), sorts by key across the cluster with range boundaries at the ranks' row
offsets (keys are dense, so no sampling pass is needed), materializes, and `split_at_indices`
cuts one part per rank. The feeder is a named zero-CPU actor on the driver's node; it owns those
blocks, starts the next chapter (or the next epoch's first) as soon as one is asked for, so the
sort overlaps training, and drops a chapter once every rank has moved past it: about two chapters
are held at a time. Resuming at (e, s) prepares the chapter holding s from s (`EpochPlan.slice`).
Where a request does not continue a range already decided (a cold start, a resume), a lead-in
comes first (`chapters.lead_in_bounds`, data.lead_tokens): small ranges growing 4x up to the
chapter's end, the smallest read and ordered in this process (`pipeline.data.local_sort`), so the
first step waits for a few steps' rows, not a chapter (on an empty row cache those small ranges
read just their rows, filling nothing). Each range's end is decided once per
(epoch, world size, start step) and given to every rank. A preparation that failed is dropped,
and the next request prepares again.
Ray restarts a dead feeder from its constructor arguments, which hold everything an epoch needs;
its blocks died with it, and the workers ask again (`pipeline.data.stream`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs

from pipeline.core.chapters import (
    RangeBook,
    RankPositions,
    chapter_end,
    chapter_of,
    chapter_plan,
    lead_in_bounds,
    plan_chapter_bounds,
    step_tokens,
)
from pipeline.core.config import RunConfig
from pipeline.core.epochs import epoch_plan_for
from pipeline.core.plan import EpochPlan, RankView
from pipeline.data.index import LengthIndex, filesystem_for
from pipeline.data.local_sort import local_parts, use_jemalloc
from pipeline.data.protocol import RankPart
from pipeline.data.read import ReadSpec, background_priority, plan_read_units
from pipeline.data.retry import RetryPolicy
from pipeline.data.rowcache import RowCache
from pipeline.data.sort_pass import rows_per_block, sorted_parts

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
# A lead-in's ranges of at most this many real tokens read just their rows and never fill the
# row cache; without the row cache they are the only ranges read and ordered inside the feeder
# (`pipeline.data.local_sort`), skipping the Ray Data pass and its fixed costs.
LOCAL_MAX_TOKENS = 2**24
# Stats of the last preparations kept for `history()` (a few epochs' chapters).
HISTORY = 256
# (handle, index ref) held by this (driver) process: a named actor without a handle would be
# reclaimed, and a restarted feeder reads its index from the ref.
_FEEDERS: dict[str, tuple] = {}


@dataclass
class _Prepared:
    prep_id: str  # tells a re-preparation of the same key from the one a worker saw fail
    plan_hash: str
    views: list[RankView]
    refs: list[list]  # per rank: ordered block refs of its part
    parts: list  # MaterializedDatasets, kept so their blocks stay alive
    stats: dict


class Feeder:
    """Builds and holds each epoch's sorted per-rank parts; see the module docstring."""

    def __init__(
        self,
        cfg: dict,
        index: LengthIndex | str,
        edges: list[int],
        path: str,
        prefetch: bool = True,
        fs: pafs.FileSystem | None = None,
        retry: RetryPolicy | None = None,
        block_bytes: int = TARGET_BLOCK_BYTES,
    ):
        index = _index_of(index)
        self.cfg = RunConfig.model_validate(cfg)
        self.index = index
        self.edges = [int(e) for e in edges]
        self.path = path
        self.prefetch = prefetch
        self.fs = fs if fs is not None else filesystem_for(path)[0]
        self.spec = ReadSpec.of(index, self.cfg.model.vocab_size, retry or RetryPolicy())
        self.rows = RowCache.for_run(self.cfg, index)
        self.block_bytes = int(block_bytes)
        use_jemalloc()  # before any read: see its docstring
        # Ray Data is imported and configured by the first chapter's sort (`sort_pass`), not
        # here: a cold start's lead-in is read in this process and should not wait for it.
        self._lock = threading.Lock()
        self._jobs: dict[tuple, Future] = {}
        self._retries: dict[tuple, int] = {}
        self._epochs: dict[tuple, tuple[EpochPlan, np.ndarray]] = {}  # see _epoch
        self._epoch_lock = threading.Lock()  # one thread plans an epoch, the others wait
        self._ranges = RangeBook()  # the range ends decided (see _end_for); under _lock
        self._positions = RankPositions()  # where each rank last asked to start
        self._peak_held_bytes = 0
        self._history: collections.deque = collections.deque(maxlen=HISTORY)
        # One preparation at a time: two concurrent sorts would only compete for the same CPUs.
        # It runs at background priority: the streams' part() calls come first.
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="feeder", initializer=background_priority
        )

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

    def _epoch(self, epoch: int, world_size: int) -> tuple[EpochPlan, np.ndarray]:
        """The epoch's plan and chapter bounds (of the full plan, so a resume keeps them),
        memoised for two epochs."""
        key = (epoch, world_size)
        with self._epoch_lock:
            if key not in self._epochs:
                plan = epoch_plan_for(self.cfg, self.index, self.edges, epoch, world_size)
                d = self.cfg.data
                bounds = plan_chapter_bounds(
                    plan, max_steps=d.chapter_steps, max_tokens=d.chapter_tokens
                )
                self._epochs[key] = (plan, bounds)
                for k in sorted(self._epochs)[:-2]:
                    del self._epochs[k]
                    with self._lock:
                        self._ranges.forget(*k)
            return self._epochs[key]

    def _end_for(
        self, epoch: int, world_size: int, start: int, end: int | None, *, may_lead: bool
    ) -> int:
        """The end step of the range served from `start`, the same for every rank.

        `end`, when given (a worker asking again for the range it had), is kept. Otherwise the
        range decided earlier for `start`; else, for a worker's request (`may_lead`) that does
        not continue a decided range (a cold start, a resume), the first range of a lead-in
        (`lead_in_bounds`, data.lead_tokens), whose later cuts are decided with it; else the
        end of the chapter holding `start`.
        """
        full, bounds = self._epoch(epoch, world_size)
        steps = full.num_steps
        if start >= steps:
            return start
        with self._lock:
            decided = self._ranges.end(epoch, world_size, start)
            if end is not None or decided is not None:
                self._ranges.record(epoch, world_size, [start, end or decided], steps)
                return end or decided
            follows = self._ranges.continues(epoch, world_size, start)
        lead = self.cfg.data.lead_tokens if may_lead and not follows else None
        cuts = [start, chapter_end(bounds, start)]
        if lead:
            tokens = step_tokens(full)
            cuts = lead_in_bounds(tokens, bounds, start, lead, first_step=full.first_step)
        with self._lock:
            return self._ranges.record(epoch, world_size, cuts, steps)

    def _prepare(self, epoch: int, world_size: int, start_step: int, end_step: int) -> _Prepared:
        key = (epoch, world_size, start_step, end_step)
        t0 = time.perf_counter()
        full, bounds = self._epoch(epoch, world_size)
        full_hash = full.content_hash
        epoch_steps = full.num_steps
        plan = chapter_plan(full, start_step, end_step)
        keys, rank_rows = plan.sort_keys()
        units = plan_read_units(self.index, plan.sample_ids, keys)
        with self._lock:
            self._retries[key] = 0
        t_plan = time.perf_counter()
        parts: list = []
        refs: list[list] = [[] for _ in range(world_size)]
        # a lead-in's range (ending before its chapter does), small enough to read here
        lead_in = end_step < chapter_end(bounds, start_step) if start_step < epoch_steps else False
        small = lead_in and 0 < int(plan.lengths.sum()) <= LOCAL_MAX_TOKENS
        local = plan.num_samples > 0 and (small or self.rows is not None)
        block_rows = rows_per_block(plan, self.block_bytes) if plan.num_samples else 1
        reads = {"rg_cached": 0, "rg_filled": 0, "rg_parquet": 0, "read_s": 0.0, "gather_s": 0.0}
        if local:
            # A lead-in's small range reads just its rows; a chapter fills the row cache.
            fill = self.rows is not None and not small
            parts, reads = local_parts(
                self.fs, self.spec, units, rank_rows, block_rows, cache=self.rows, fill=fill
            )
            retries = reads.pop("read_retries")
            if retries:
                self.note_read_retries(key, retries)
        elif plan.num_samples:
            parts = sorted_parts(self.fs, self.spec, plan, units, rank_rows, block_rows, key)
            reads["rg_parquet"] = int(len(units["file_idx"]))
        t_sort = time.perf_counter()
        if parts:
            refs = [p.to_arrow_refs() for p in parts]
        t_split = time.perf_counter()
        stats = {
            "epoch": epoch,
            "world_size": world_size,
            "start_step": start_step,
            "end_step": end_step,
            "epoch_steps": epoch_steps,
            "chapter": chapter_of(bounds, start_step) if start_step < epoch_steps else -1,
            "chapters": int(bounds.size - 1),
            "bytes": int(sum(p.size_bytes() for p in parts)),
            "steps": plan.num_steps,
            "rows_sorted": plan.num_samples,
            "row_groups_read": int(len(units["file_idx"])),
            "tokens": int(plan.lengths.sum()),
            "in_feeder": local,
            **reads,  # row groups served from the row cache, read and cached, read from parquet
            "plan_s": t_plan - t0,
            "sort_s": t_sort - t_plan,
            "split_s": t_split - t_sort,
            "plan_hash": full_hash,
            "done_at": time.time(),  # wall clock, to line preparations up with their consumers
        }
        with self._lock:
            stats["read_retries"] = self._retries.get(key, 0)
            # Not done yet: held at once = the finished preparations + this one.
            held = self._done_bytes() + stats["bytes"]
            self._peak_held_bytes = max(self._peak_held_bytes, held)
            self._history.append(stats)
        return _Prepared(
            prep_id=uuid.uuid4().hex[:12],
            plan_hash=full_hash,
            views=[plan.rank_view(r) for r in range(world_size)],
            refs=refs,
            parts=parts,
            stats=stats,
        )

    def prepare(self, epoch: int, world_size: int, start_step: int = 0) -> dict:
        """Prepare (or wait for) the parts of (epoch, world_size, start_step) to the end of its
        range (a chapter's, unless a lead-in decided otherwise); returns timings."""
        end = self._end_for(epoch, world_size, start_step, None, may_lead=False)
        return self._prepared((epoch, world_size, start_step, end)).stats

    def part(
        self,
        epoch: int,
        world_size: int,
        start_step: int,
        rank: int,
        stale: str | None = None,
        end_step: int | None = None,
    ) -> RankPart:
        """Rank `rank`'s part of the range from `start_step`: to its chapter's end, or, where
        nothing was prepared, a lead-in's first range (`_end_for`). Once every rank has asked
        for this range (so none needs an earlier one), the next one (or the next epoch's first
        chapter) starts preparing: about two chapters are held at once. `stale`: a prep_id
        whose blocks a worker found lost, prepared again instead of handed out twice;
        `end_step`: the end that worker had, kept so it can skip what it already delivered."""
        held = self._held(epoch, world_size, start_step) if end_step is None else None
        if held is not None:  # ranks restarting inside a range this feeder still holds
            (_, _, first, end), prep = held
        else:
            end = self._end_for(epoch, world_size, start_step, end_step, may_lead=True)
            prep = self._prepared((epoch, world_size, start_step, end), stale)
            first = None
        steps = prep.stats["epoch_steps"]
        everyone_here = self.consumed(epoch, world_size, start_step, rank)
        if self.prefetch and everyone_here:
            if end < steps:
                self._prefetch((epoch, world_size, end))
            elif epoch + 1 < self.cfg.train.epochs:  # no sort nobody will read
                # planned on the preparing thread, not in this rank's request
                self._pool.submit(self._prefetch, (epoch + 1, world_size, 0))
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
            end_step=end,
            epoch_steps=steps,
            first_step=first,
        )

    def _held(self, epoch: int, world_size: int, start: int) -> tuple | None:
        """(key, preparation) of a finished range that holds `start` past its first step, where
        no range from `start` was decided: ranks that Ray Train restarted from a checkpoint
        while this feeder lived (a worker lost, the driver not) resume inside the chapter they
        were training. Their streams skip to `start` in the blocks already held instead of
        waiting for a lead-in that reads the corpus again."""
        with self._lock:
            if self._ranges.end(epoch, world_size, start) is not None:
                return None
            for key, fut in self._jobs.items():
                if key[:2] != (epoch, world_size) or not key[2] < start < key[3]:
                    continue
                if fut.done() and fut.exception() is None:
                    return key, fut.result()
        return None

    def start_at(self, epoch: int, world_size: int, start_step: int = 0) -> int:
        """Start preparing the range a stream starting at (epoch, start_step) will ask for (a
        lead-in's first, decided as that request would), without waiting: called by the driver
        right after starting the feeder, the read overlaps the workers' start-up. Returns the
        range's end step."""
        end = self._end_for(epoch, world_size, start_step, None, may_lead=True)
        if start_step < end:
            self._submit((epoch, world_size, start_step, end))
        return end

    def _prefetch(self, nxt: tuple) -> None:
        """Decide `nxt`'s range (a regular chapter) and queue its preparation."""
        self._submit((*nxt, self._end_for(*nxt, None, may_lead=False)))

    def consumed(self, epoch: int, world_size: int, step: int, rank: int) -> bool:
        """Rank `rank` needs nothing before global step `step` of `epoch` any more (it asked to
        start there, or acknowledges a chapter it finished). A chapter every rank has moved past
        is dropped here; its blocks are freed once the workers drop their refs as well. A rank
        asking with another world size drops what the old world size left behind. Returns
        whether every rank is at (epoch, step) or beyond."""
        with self._lock:
            self._positions.move(epoch, world_size, step, rank)
            for k, f in list(self._jobs.items()):
                # A failed one stays until asked for again: status() shows its error till then.
                if f.done() and (
                    k[1] != world_size
                    or (
                        f.exception() is None
                        and self._positions.passed(k[0], f.result().stats["end_step"])
                    )
                ):
                    del self._jobs[k]
            return self._positions.passed(epoch, step)

    def _done_bytes(self) -> int:
        """Bytes of the parts this feeder holds (its finished preparations); under the lock."""
        return sum(
            f.result().stats["bytes"]
            for f in self._jobs.values()
            if f.done() and f.exception() is None
        )

    def history(self) -> list[dict]:
        """Stats of the last preparations (HISTORY), oldest first, released ones included."""
        with self._lock:
            return list(self._history)

    def memory(self) -> dict:
        """Bytes of the parts held now, and the most held at once (at a preparation's end)."""
        with self._lock:
            held = self._done_bytes()
            self._peak_held_bytes = max(self._peak_held_bytes, held)
            keys = sorted(k for k, f in self._jobs.items() if f.done() and f.exception() is None)
            return {"held_bytes": held, "peak_held_bytes": self._peak_held_bytes, "held": keys}

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
    node = ray.get_runtime_context().get_node_id()
    holder_name = f"{name}-index"
    holder = (
        ray.remote(num_cpus=0, max_restarts=0)(IndexHolder)
        .options(
            name=holder_name, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        )
        .remote(index)
    )
    actor_cls = ray.remote(
        num_cpus=0,
        max_concurrency=FEEDER_MAX_CONCURRENCY,
        max_restarts=FEEDER_MAX_RESTARTS,
        # A part() call cut short by a restart runs again on the new feeder: it only prepares.
        max_task_retries=-1,
    )(Feeder)
    handle = actor_cls.options(
        name=name, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    ).remote(
        cfg.model_dump(mode="json"),
        # The holder's name, not the index: Ray does not keep a restartable actor's constructor
        # arguments that live in the object store (it warns at error level), so a restarted
        # feeder fetches the index again from the holder.
        holder_name,
        list(edges),
        path,
        prefetch,
        # Resolved here so the actor reads with the driver's endpoint (AWS_ENDPOINT_URL), as the
        # index scan does; a pickled filesystem carries the endpoint, never the credentials.
        filesystem if filesystem is not None else filesystem_for(path)[0],
        retry,
        block_bytes,
    )
    _FEEDERS[name] = (handle, holder)
    return handle


class IndexHolder:
    """The run's length index for the feeder's starts and restarts (a zero-CPU actor on the
    feeder's node that is never restarted, so its own constructor argument is safe)."""

    def __init__(self, index: LengthIndex):
        self.index = index

    def get(self) -> LengthIndex:
        return self.index


def _index_of(index: LengthIndex | str) -> LengthIndex:
    """The constructor's index: given directly (tests, an in-process feeder) or as the name of
    its IndexHolder actor."""
    if isinstance(index, str):
        import ray

        return ray.get(ray.get_actor(index).get.remote())
    return index


def stop_feeder(name: str) -> None:
    """Kill the named feeder (if any, and for good), releasing the epochs it holds."""
    import ray

    _FEEDERS.pop(name, None)
    for actor in (name, f"{name}-index"):
        try:
            ray.kill(ray.get_actor(actor), no_restart=True)
        except ValueError:
            pass
