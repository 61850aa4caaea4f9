"""bucketray's delivery for your own training loop: a small, stable API (docs/own_loop.md).

On the driver, once:

    with prepare_delivery(cfg) as delivery:   # index, bucket edges, feeder actor started
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
and not on the world size, so the global batches are the same on 1 or 64 workers. To resume,
pass the next step as `start_step`. A rank's share of a small bucket's last batch can be empty
(B = 0): `batch_tensors` then returns a one-row batch with no supervised token, so the rank
still takes part in every DDP collective. `labels` are aligned with `input_ids` (shift them
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
from pipeline.core.epochs import resolve_edges, run_epoch_plans
from pipeline.core.runlength import run_length
from pipeline.data.connect import connect
from pipeline.data.feeder import start_feeder, stop_feeder
from pipeline.data.index import build_length_index, resolve_data_path
from pipeline.data.rechunk import MicroBatch
from pipeline.data.stream import rank_batches

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

    def to_dict(self) -> dict:
        return asdict(self)

    def __enter__(self) -> Delivery:
        return self

    def __exit__(self, *exc) -> None:  # `with prepare_delivery(cfg) as d:` stops the feeder
        stop_delivery(self)

    @classmethod
    def from_dict(cls, d: dict) -> Delivery:
        return cls(**d)


def prepare_delivery(cfg: RunConfig, *, name: str | None = None) -> Delivery:
    """Driver side: find (or build) the data, index it, choose the edges, start the feeder.

    Starts Ray if it is not up yet (`pipeline.data.connect`: the cluster in RAY_ADDRESS, else a
    private local one; a named cluster that does not answer fails in seconds). The feeder
    lives until `stop_delivery`, the end of a `with prepare_delivery(cfg) as delivery:` block, or
    the end of the driver.
    """
    connect()
    path = resolve_data_path(cfg)
    index = build_length_index(cfg, path)
    edges = [int(e) for e in resolve_edges(cfg, index.lengths)]
    steps = [p.num_steps for p in run_epoch_plans(cfg, index, edges, world_size=1)]
    if steps[0] == 0:
        raise ConfigError(
            f"no training steps: {len(index.lengths)} valid samples under buckets {edges}"
        )
    name = name or f"bucketray-feeder-{uuid.uuid4().hex[:8]}"
    start_feeder(cfg, index, edges, name=name, path=path)
    total = run_length(steps, cfg.train).global_steps
    return Delivery(name, path, edges, steps[0], int(len(index.lengths)), steps, total)


def stop_delivery(delivery: Delivery) -> None:
    """Stop the feeder (frees the epochs it holds in the object store)."""
    stop_feeder(delivery.feeder)


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

    `rank` and `world_size` default to the Ray Train context's.
    """
    if rank is None or world_size is None:
        import ray.train

        ctx = ray.train.get_context()
        rank = ctx.get_world_rank() if rank is None else rank
        world_size = ctx.get_world_size() if world_size is None else world_size
    planned = delivery.epoch_steps
    steps = planned[epoch] if epoch < len(planned) else delivery.steps_per_epoch
    if not 0 <= start_step <= steps:
        raise ValueError(f"start_step={start_step} is outside the epoch's 0..{steps} steps")
    yield from rank_batches(
        delivery.feeder,
        epoch=epoch,
        start_step=start_step,
        rank=rank,
        world_size=world_size,
        pin_memory=pin_memory,
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


def batch_tensors(mb: MicroBatch, device=None) -> dict:
    """The micro-batch's tensors on `device`: input_ids, attention_mask, position_ids, labels
    (int64 [B, L]; with batching.mode=packed, B rows of row_tokens whose attention_mask holds
    each token's document number as int32, 0 on padding, and positions restart per document:
    the model must attend within documents, pipeline/learn/packed_attention.py). An empty
    micro-batch becomes a 1 x 2 batch whose labels are all -100."""
    import torch

    if mb.input_ids.numel() == 0:
        z = torch.zeros(1, 2, dtype=torch.int64)
        t = {
            "input_ids": z,
            "attention_mask": torch.tensor([[1, 0]]),
            "position_ids": z,
            "labels": torch.full_like(z, IGNORE_INDEX),
        }
    else:
        names = ("input_ids", "attention_mask", "position_ids", "labels")
        t = {n: getattr(mb, n) for n in names}
    return {k: v.to(device, non_blocking=True) if device is not None else v for k, v in t.items()}
