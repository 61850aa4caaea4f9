"""bucketray's delivery for your own training loop: a small, stable API (docs/own_loop.md).

On the driver, once:

    with prepare_delivery(cfg) as delivery:   # index, edges, epoch plans, feeder started
        trainer = TorchTrainer(my_loop, train_loop_config={"delivery": delivery.to_dict(), ...})
        trainer.fit()                         # the feeder stops at the end of the block

In each Ray Train worker:

    delivery = Delivery.from_dict(config["delivery"])
    for mb in iter_run(delivery, start_step=0):   # the run's steps, epoch after epoch
        x = batch_tensors(mb, device)     # input_ids, attention_mask, position_ids, labels
        loss = next_token_loss(model(x["input_ids"]), x["labels"])
        ...

(`iter_micro_batches(delivery, epoch=e)` gives one epoch's steps.)

Every rank gets exactly one micro-batch per global step of the epoch, all from the same bucket
(`mb.bucket`), in the same order on every rank: the epoch's plan depends on (plan.seed, epoch)
and not on the world size, so the global batches are the same on 1 or 64 workers; each rank
checks that the feeder serves the plans the driver made (`Delivery.plan_hashes`). The driver
side is `jobs.train`'s (`pipeline.data.driver`). To resume, pass the next step as `start_step`
(and the steps done to `prepare_delivery`, which starts reading there). A rank's share of a
small bucket's last batch can be empty (B = 0): `batch_tensors` then returns a one-row batch
with no supervised token (`pipeline.data.tensors`), so the rank still takes part in every DDP
collective. `labels` are aligned with `input_ids` (shift them
by one for next-token loss) and are -100 on padding and on unsupervised tokens.

With batching.mode=packed the steps are packed rows (docs/architecture.md, "Packed rows"): a
micro-batch is a rank's share of its step's rows, `mb.bucket` the bucket of the step's first row.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from pipeline.core.collate import IGNORE_INDEX
from pipeline.core.config import ConfigError, RunConfig
from pipeline.data.connect import connect
from pipeline.data.driver import (
    find_run_data,
    fixed_world_size,
    plan_run,
    run_position,
    start_run_feeder,
)
from pipeline.data.feeder import stop_feeder
from pipeline.data.rechunk import MicroBatch
from pipeline.data.run_warnings import (
    ConsoleRelay,
    collector_name,
    forward_warnings,
    start_collector,
)
from pipeline.data.stream import rank_batches
from pipeline.data.tensors import batch_tensors

__all__ = [
    "Delivery",
    "MicroBatch",
    "batch_tensors",
    "iter_micro_batches",
    "iter_run",
    "next_token_loss",
    "prepare_delivery",
    "stop_delivery",
]


@dataclass(frozen=True)
class Delivery:
    """What a worker needs to read its micro-batches: plain values, safe to send to workers."""

    feeder: str  # name of the feeder actor
    path: str  # the data (directory or URI)
    edges: list[int]  # bucket edges [0, e1, ..., top]; bucket k holds lengths in (e_k, e_k+1]
    steps_per_epoch: int  # global steps of epoch 0 (the same for every world size)
    num_samples: int  # valid samples in one epoch
    # Global steps of each epoch the run reaches (train.epochs, cut at train.max_steps): with
    # batching.fill greedy each epoch's plan has its own count.
    epoch_steps: list[int] = field(default_factory=list)
    total_steps: int = 0  # global steps of the whole run (train.epochs, train.max_steps)
    # Each planned epoch's plan hash: a rank refuses a feeder answer planned differently.
    plan_hashes: list[str] = field(default_factory=list)
    world_size: int = 1  # the world size the epochs were planned at
    # The warning collector the workers forward to (pipeline.data.run_warnings); None: none.
    warnings: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def __enter__(self) -> Delivery:
        return self

    def __exit__(self, *exc) -> None:  # `with prepare_delivery(cfg) as d:` stops the feeder
        stop_delivery(self)

    @classmethod
    def from_dict(cls, d: dict) -> Delivery:
        return cls(**d)


def prepare_delivery(
    cfg: RunConfig,
    *,
    name: str | None = None,
    world_size: int | None = None,
    start_step: int = 0,
) -> Delivery:
    """Driver side: find (or build) the data, index it, choose the edges, plan the run's epochs,
    start the feeder -- the setup `jobs.train` makes (`pipeline.data.driver`).

    `world_size`: the workers your trainer runs (default scaling.num_workers); the epochs are
    planned at it, and the feeder starts preparing the first range the ranks will ask for, from
    the run's global step `start_step` (the steps a resumed run has done), while the workers
    start (not with an elastic scaling.min_workers and no `world_size`: the world size is then
    only known in the workers). Starts Ray if it is not up yet (`pipeline.data.connect`: the cluster in RAY_ADDRESS,
    else a private local one; a named cluster that does not answer fails in seconds). The
    feeder lives until `stop_delivery`, the end of a `with prepare_delivery(cfg) as delivery:`
    block, or the end of the driver.
    """
    connect()
    name = name or f"bucketray-feeder-{uuid.uuid4().hex[:8]}"
    warnings_to = _start_warnings(name)  # before the index tasks and the feeder start
    data = find_run_data(cfg)
    known = world_size if world_size is not None else fixed_world_size(cfg)
    world = known if known is not None else cfg.scaling.num_workers  # elastic: as jobs.train
    plan = plan_run(cfg, data, world_size=world)
    start_run_feeder(
        cfg, data, plan, name=name, world_size=known, at=run_position(plan, start_step)
    )
    return Delivery(
        feeder=name,
        path=data.path,
        edges=data.edges,
        steps_per_epoch=plan.steps[0],
        num_samples=int(len(data.index.lengths)),
        epoch_steps=plan.steps,
        total_steps=plan.total_steps,
        plan_hashes=plan.hashes,
        world_size=world,
        warnings=warnings_to,
    )


# Per feeder name: the warning collector's handle and the relay printing its warnings here.
_WARNINGS: dict[str, tuple] = {}


def _start_warnings(feeder: str) -> str | None:
    """The delivery's warning collector and its console relay (pipeline.data.run_warnings), so
    the feeder's, the index tasks' and the workers' warnings show here once each."""
    import ray

    if not ray.is_initialized():  # a caller standing in for Ray
        return None
    _stop_warnings(feeder)
    name = collector_name(feeder)
    handle = start_collector(name)
    _WARNINGS[feeder] = (handle, ConsoleRelay(name).__enter__())
    return name


def _stop_warnings(feeder: str) -> None:
    found = _WARNINGS.pop(feeder, None)
    if found is not None:
        import ray

        handle, relay = found
        relay.close()  # the last warnings, and how often the repeated ones came
        ray.kill(handle)


def stop_delivery(delivery: Delivery) -> None:
    """Stop the feeder (frees the epochs it holds in the object store) and print the warnings
    that came in since the last ones shown."""
    stop_feeder(delivery.feeder)
    _stop_warnings(delivery.feeder)


def iter_micro_batches(
    delivery: Delivery,
    *,
    epoch: int,
    start_step: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    pin_memory: bool = False,
) -> Iterator[MicroBatch]:
    """Worker side: this rank's micro-batches of `epoch`, one per global step from `start_step`.

    `rank` and `world_size` default to the Ray Train context's; a rank outside
    0..world_size-1 is refused here (ConfigError), before the feeder is asked.
    """
    if rank is None or world_size is None:
        import ray.train

        ctx = ray.train.get_context()
        rank = ctx.get_world_rank() if rank is None else rank
        world_size = ctx.get_world_size() if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(
            f"rank={rank} is not a rank of world_size={world_size}: ranks are 0..{world_size - 1}; "
            "pass each worker its own rank and the number of workers (or leave both out inside "
            "Ray Train, which knows them)"
        )
    if delivery.warnings is not None:  # to the driver's console, once each
        forward_warnings(delivery.warnings, f"rank {rank}")
    planned = delivery.epoch_steps
    steps = planned[epoch] if epoch < len(planned) else delivery.steps_per_epoch
    if not 0 <= start_step <= steps:
        raise ValueError(f"start_step={start_step} is outside the epoch's 0..{steps} steps")
    hashes = delivery.plan_hashes
    yield from rank_batches(
        delivery.feeder,
        epoch=epoch,
        start_step=start_step,
        rank=rank,
        world_size=world_size,
        pin_memory=pin_memory,
        # the feeder must serve the plans the driver made (PlanMismatchError otherwise)
        plan_hash=hashes[epoch] if epoch < len(hashes) else None,
    )


def iter_run(
    delivery: Delivery,
    *,
    start_step: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    pin_memory: bool = False,
) -> Iterator[MicroBatch]:
    """Worker side: this rank's micro-batches of the whole run, epoch after epoch, one per global
    step from `start_step` (counted over the run) to `delivery.total_steps`. Each micro-batch's
    `epoch` and `step` say where it is in its epoch; to resume, pass the steps done so far."""
    first = 0  # the run's global step at which the epoch starts
    for epoch, planned in enumerate(delivery.epoch_steps):
        take = min(planned, delivery.total_steps - first)  # the last epoch may be cut short
        if start_step < first + take:
            skip = max(start_step - first, 0)
            batches = iter_micro_batches(
                delivery,
                epoch=epoch,
                start_step=skip,
                rank=rank,
                world_size=world_size,
                pin_memory=pin_memory,
            )
            yield from (mb for _, mb in zip(range(take - skip), batches, strict=False))
        first += planned


def next_token_loss(logits, labels):
    """Mean next-token cross-entropy of `logits` [B, L, V] against `labels` [B, L] (aligned with
    the inputs, -100 where not supervised): position i predicts label i + 1. A micro-batch
    without a supervised token gives 0 (with a gradient), not NaN."""
    import torch.nn.functional as F

    logits, target = logits[:, :-1], labels[:, 1:]
    total = F.cross_entropy(
        logits.flatten(0, 1), target.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return total / max(int((target != IGNORE_INDEX).sum()), 1)
