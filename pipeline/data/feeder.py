"""The feeder actor: schedules each range's preparation, hands the ranks their parts, frees them.

An epoch's global steps are served as consecutive ranges: chapters (at most delivery.chapter_tokens
real tokens or delivery.chapter_steps steps each), and where a request does not continue a range
already decided (a cold start, a resume) a lead-in of small ranges first, so the first step
waits for a few steps' rows, not a chapter. Which range a request is served is decided in
`pipeline.core.ranges` (each range's end once per (epoch, world size, start step), the same for
every rank); how a range is read -- from the row cache in this process, or by a Ray Data pass
that sorts by key across the cluster -- and what that took is `pipeline.data.prepare`.

This actor keeps scheduling and lifecycle: it is a named zero-CPU actor on the driver's node
that owns the prepared blocks, prepares one range at a time at background priority, starts the
next range (or the next epoch's first) as soon as every rank has asked for the current one, so
the preparation overlaps training, and drops a range once every rank has moved past it: about
two chapters are held at a time. A preparation that failed is dropped, and the next request
prepares again. Resuming at (e, s) prepares from s (`EpochPlan.slice`).
Ray restarts a dead feeder from its constructor arguments, which hold everything an epoch needs;
its blocks died with it, and the workers ask again (`pipeline.data.stream`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow.fs as pafs

from pipeline.core.config import RunConfig
from pipeline.core.epochs import epoch_plan_for, epoch_windows
from pipeline.core.plan import EpochPlan
from pipeline.core.ranges import RangeDecisions, RankPositions
from pipeline.data.connect import on_this_node
from pipeline.data.gather import use_jemalloc
from pipeline.data.index import LengthIndex, filesystem_for
from pipeline.data.prepare import TARGET_BLOCK_BYTES, PreparedRange, RangeKey, RangePreparer
from pipeline.data.protocol import RankPart
from pipeline.data.read import ReadSpec, background_priority
from pipeline.data.retry import RetryPolicy
from pipeline.data.rowcache import RowCache
from pipeline.data.run_warnings import active_collector, forward_warnings

__all__ = ["Feeder", "start_feeder", "stop_feeder", "FEEDER_MAX_CONCURRENCY"]

log = logging.getLogger("bucketray.data")

# Enough threads for every rank's part() call plus the background preparation.
FEEDER_MAX_CONCURRENCY = 64
# Restarts after the feeder process dies (OOM, a killed worker process). Each one costs a
# re-sort of the epoch in flight; a feeder that keeps dying has a cause no restart fixes, and
# once they are used up the workers' requests fail, and the run with them, instead of waiting.
FEEDER_MAX_RESTARTS = 4
# Stats of the last preparations kept for `history()` (a few epochs' chapters).
HISTORY = 256
# (handle, index ref) held by this (driver) process: a named actor without a handle would be
# reclaimed, and a restarted feeder reads its index from the ref.
_FEEDERS: dict[str, tuple] = {}


class Feeder:
    """Schedules, holds and frees each epoch's prepared ranges; see the module docstring."""

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
        warnings_to: str | None = None,
    ):
        if warnings_to is not None:  # an actor of a run: its warnings reach the driver's console
            forward_warnings(warnings_to, "feeder")
        index = _index_of(index)
        self.cfg = RunConfig.model_validate(cfg)
        self.index = index
        self.edges = [int(e) for e in edges]
        self.path = path
        self.prefetch = prefetch
        fs = fs if fs is not None else filesystem_for(path)[0]
        spec = ReadSpec.of(index, self.cfg.model.vocab_size, retry or RetryPolicy())
        rows = RowCache.for_run(self.cfg, index)
        self.preparer = RangePreparer(
            fs, spec, index, rows, block_bytes, lambda e: epoch_windows(self.cfg, index, e)
        )
        use_jemalloc()  # before any read: see its docstring
        # Ray Data is imported and configured by the first chapter's sort (`sort_pass`), not
        # here: a cold start's lead-in is read in this process and should not wait for it.
        self.ranges = RangeDecisions(self._plan_epoch, self.cfg.delivery_used)
        self._lock = threading.Lock()
        self._jobs: dict[tuple, Future] = {}
        self._retries: dict[tuple, int] = {}
        self._positions = RankPositions()  # where each rank last asked to start; under _lock
        self._nodes: dict[tuple[int, int], str] = {}  # (world size, rank): its node; under _lock
        self._peak_held_bytes = 0
        self._history: collections.deque = collections.deque(maxlen=HISTORY)
        # One preparation at a time: two concurrent sorts would only compete for the same CPUs.
        # It runs at background priority: the streams' part() calls come first.
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="feeder", initializer=background_priority
        )

    def _plan_epoch(self, epoch: int, world_size: int) -> EpochPlan:
        return epoch_plan_for(self.cfg, self.index, self.edges, epoch, world_size)

    def _submit(
        self, key: tuple, stale: str | None = None, ahead: bool = False
    ) -> tuple[Future, bool]:
        """(the preparation of `key`, whether this call started it). A failed one, or the one
        with prep_id `stale`, is dropped and started anew. `ahead`: prepared before any rank
        waits for it (a prefetch), so its blocks are placed on their ranks' nodes; a range a
        rank waits for is handed out as the pass left it (its ranks pull while they train)."""
        with self._lock:
            fut = self._jobs.get(key)
            if fut is not None and fut.done():
                failed = fut.exception() is not None
                if failed or (stale is not None and fut.result().prep_id == stale):
                    fut = None
            if fut is not None:
                return fut, False
            fut = self._jobs[key] = self._pool.submit(self._prepare, RangeKey(*key), ahead)
            return fut, True

    def _prepared(self, key: tuple, stale: str | None = None) -> PreparedRange:
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

    def _prepare(self, key: RangeKey, ahead: bool = False) -> PreparedRange:
        """Prepare `key` (`pipeline.data.prepare`), counting its read retries and the bytes held;
        placing its blocks where it is prepared `ahead` (`_submit`)."""
        t0 = time.perf_counter()
        epoch = self.ranges.epoch(key.epoch, key.world_size)
        with self._lock:
            self._retries[key] = 0
        with self._lock:
            nodes = [self._nodes.get((key.world_size, r)) for r in range(key.world_size)]
        nodes = nodes if ahead else None
        prep = self.preparer.prepare(
            epoch, key, started=t0, note_retries=self.note_read_retries, nodes=nodes
        )
        with self._lock:
            stats = dataclasses.replace(prep.stats, read_retries=self._retries.get(key, 0))
            # Not done yet: held at once = the finished preparations + this one.
            held = self._done_bytes() + stats.bytes
            self._peak_held_bytes = max(self._peak_held_bytes, held)
            self._history.append(stats.as_dict())
        return dataclasses.replace(prep, stats=stats)

    def prepare(self, epoch: int, world_size: int, start_step: int = 0) -> dict:
        """Prepare (or wait for) the parts of (epoch, world_size, start_step) to the end of its
        range (a chapter's, unless a lead-in decided otherwise); returns timings."""
        end = self.ranges.end_for(epoch, world_size, start_step, None, may_lead=False)
        return self._prepared((epoch, world_size, start_step, end)).stats.as_dict()

    def part(
        self,
        epoch: int,
        world_size: int,
        start_step: int,
        rank: int,
        stale: str | None = None,
        end_step: int | None = None,
        node: str | None = None,
    ) -> RankPart:
        """Rank `rank`'s part of the range from `start_step`: to its chapter's end, or, where
        nothing was prepared, a lead-in's first range (`RangeDecisions.end_for`). Once every
        rank has asked for this range (so none needs an earlier one), the next one (or the next
        epoch's first chapter) starts preparing: about two chapters are held at once. `stale`:
        a prep_id whose blocks a worker found lost, prepared again instead of handed out twice;
        `end_step`: the end that worker had, kept so it can skip what it already delivered;
        `node`: the rank's node, where the blocks of the ranges prepared from now on are placed."""
        if node is not None:
            with self._lock:
                self._nodes[(world_size, rank)] = node
        held = self._held(epoch, world_size, start_step) if end_step is None else None
        if held is not None:  # ranks restarting inside a range this feeder still holds
            (_, _, first, end), prep = held
        else:
            end = self.ranges.end_for(epoch, world_size, start_step, end_step, may_lead=True)
            prep = self._prepared((epoch, world_size, start_step, end), stale)
            first = None
        steps = prep.stats.epoch_steps
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
            read_retries=prep.stats.read_retries,
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
        if self.ranges.decided(epoch, world_size, start):
            return None
        with self._lock:
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
        end = self.ranges.end_for(epoch, world_size, start_step, None, may_lead=True)
        if start_step < end:
            self._submit((epoch, world_size, start_step, end))
        return end

    def _prefetch(self, nxt: tuple) -> None:
        """Decide `nxt`'s range (a regular chapter) and queue its preparation."""
        self._submit((*nxt, self.ranges.end_for(*nxt, None, may_lead=False)), ahead=True)

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
                        and self._positions.passed(k[0], f.result().stats.end_step)
                    )
                ):
                    del self._jobs[k]
            return self._positions.passed(epoch, step)

    def _done_bytes(self) -> int:
        """Bytes of the parts this feeder holds (its finished preparations); under the lock."""
        return sum(
            f.result().stats.bytes
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
                out.append(f.result().stats.as_dict())
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

    stop_feeder(name)
    holder_name = f"{name}-index"
    holder = (
        ray.remote(num_cpus=0, max_restarts=0)(IndexHolder)
        .options(name=holder_name, scheduling_strategy=on_this_node())
        .remote(index)
    )
    actor_cls = ray.remote(
        num_cpus=0,
        max_concurrency=FEEDER_MAX_CONCURRENCY,
        max_restarts=FEEDER_MAX_RESTARTS,
        # A part() call cut short by a restart runs again on the new feeder: it only prepares.
        max_task_retries=-1,
    )(Feeder)
    handle = actor_cls.options(name=name, scheduling_strategy=on_this_node()).remote(
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
        active_collector(),
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
