"""A rank's micro-batch stream inside a Ray Train worker: ask the feeder, fetch blocks, pad.

The worker asks the feeder for its part of (epoch, world size, start step) -- the rows of the
chapter holding the start step, from there to the chapter's end, or where nothing was prepared
(a cold start, a resume) a small lead-in range the feeder chose, or, for a worker restarted
inside a range the feeder still holds, that range with the steps before its start to skip --
checks the answer (`RankPart.check`: the request it answers and, given the run's plan hash, the
plan), fetches the part's blocks in order while the previous one is padded, and re-chunks them
(`rechunk.deliver`).
At the part's end it tells the feeder it is done with it and asks for the next range, until the
epoch's last step. If the feeder dies, its blocks die with it (it owns them): Ray restarts
the feeder, and the stream asks again for the same part, skips the micro-batches it already
yielded and goes on, so the sequence is the one an undisturbed stream gives. Every rank asks for
the same key, so the restarted feeder sorts the chapter once for all of them.
The trainer runs this stream on a thread of its own, ahead of the step
(`pipeline.train.prefetch`), so its `ray.get`, padding and pinning overlap the device's work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator

import pyarrow as pa

from pipeline.data.protocol import RankPart
from pipeline.data.rechunk import MicroBatch, deliver

__all__ = ["rank_batches", "FeederLostError", "MAX_FEEDER_LOSSES"]

log = logging.getLogger("bucketray.data")

# Losses of the feeder (or of its blocks) one stream rides through before it gives up and lets
# Ray Train restart the workers from their last checkpoint. The feeder itself restarts a bounded
# number of times (feeder.FEEDER_MAX_RESTARTS), so this only bounds the work a stream repeats.
MAX_FEEDER_LOSSES = 3


class FeederLostError(RuntimeError):
    """The feeder or its blocks were lost more often than a stream rides through."""


def _prefetched_blocks(refs, ahead: int = 2) -> Iterator[pa.Table]:
    """Yield the blocks in order, asking Ray to pull the next `ahead` while one is padded."""
    import ray

    for i, ref in enumerate(refs):
        nxt = list(refs[i + 1 : i + 1 + ahead])
        if nxt:
            ray.wait(nxt, num_returns=len(nxt), timeout=0, fetch_local=True)
        yield ray.get(ref)


def rank_batches(
    feeder_name: str,
    *,
    epoch: int,
    start_step: int,
    rank: int,
    world_size: int,
    pin_memory: bool = False,
    plan_hash: str | None = None,
) -> Iterator[MicroBatch]:
    """This rank's micro-batches of `epoch` from global step `start_step` on, one per step.

    `plan_hash`, the hash of the epoch's plan as the driver computed it (and the checkpoint
    recorded), makes the stream refuse a feeder serving another plan (`PlanMismatchError`).
    """
    import ray

    feeder = ray.get_actor(feeder_name)
    step = start_step
    while True:
        step, epoch_steps = yield from _chapter_batches(
            feeder, feeder_name, epoch, step, rank, world_size, pin_memory, plan_hash
        )
        # Done with this chapter (its refs are dropped): the feeder drops it once every rank is.
        # Not retried: an ack a restarted feeder misses is made good by the next request.
        feeder.consumed.options(max_task_retries=0).remote(epoch, world_size, step, rank)
        if step >= epoch_steps:
            return


def _chapter_batches(
    feeder, feeder_name, epoch, start_step, rank, world_size, pin_memory, plan_hash
) -> Generator[MicroBatch, None, tuple[int, int]]:
    """One part's micro-batches, riding through feeder losses; returns (its end step, the
    epoch's steps)."""
    import ray
    from ray.exceptions import ObjectLostError, RayActorError

    yielded, stale, end = 0, None, None
    for loss in range(MAX_FEEDER_LOSSES + 1):
        try:
            # Asked again (after a loss) with the end it had, so what it already yielded is in it.
            node = ray.get_runtime_context().get_node_id()  # its blocks are placed there
            part: RankPart = ray.get(
                feeder.part.remote(epoch, world_size, start_step, rank, stale, end, node)
            )
            part.check(
                epoch=epoch,
                world_size=world_size,
                start_step=start_step,
                rank=rank,
                plan_hash=plan_hash,
            )
            stale, end = part.prep_id, part.end_step
            for mb in deliver(
                part.view,
                _prefetched_blocks(part.refs),
                epoch=epoch,
                pad_id=part.pad_id,
                pad_to_multiple_of=part.pad_to_multiple_of,
                supervision=part.supervision,
                pin_memory=pin_memory,
                skip=part.skip_steps + yielded,
            ):
                yield mb
                yielded += 1
            return part.end_step, part.epoch_steps
        except (ObjectLostError, RayActorError) as e:
            if getattr(e, "actor_init_failed", False):
                raise  # the feeder cannot start at all: asking again would fail the same way
            where = (
                f"rank {rank} epoch {epoch} after {yielded} micro-batches from step {start_step}"
            )
            if loss == MAX_FEEDER_LOSSES:
                raise FeederLostError(
                    f"{where}: the feeder '{feeder_name}' or its blocks were lost "
                    f"{loss + 1} times ({type(e).__name__}); giving up so Ray Train restarts "
                    "the workers from the last checkpoint"
                ) from e
            log.warning("%s: feeder blocks lost (%s); asking the feeder again", where, e)
            time.sleep(min(2.0**loss, 10.0))  # a restarting feeder needs a moment anyway
