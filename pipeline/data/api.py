"""bucketray's delivery for your own training loop: a small, stable API (docs/own_loop.md).

On the driver, once:

    delivery = prepare_delivery(cfg)          # index, bucket edges, feeder actor started
    trainer = TorchTrainer(my_loop, train_loop_config={"delivery": delivery.to_dict(), ...})
    trainer.fit(); stop_delivery(delivery)

In each Ray Train worker:

    delivery = Delivery.from_dict(config["delivery"])
    for epoch in range(E):
        for mb in iter_micro_batches(delivery, epoch=epoch, start_step=0):
            x = batch_tensors(mb, device)     # input_ids, attention_mask, position_ids, labels
            ...

Every rank gets exactly one micro-batch per global step of the epoch, all from the same bucket
(`mb.bucket`), in the same order on every rank: the epoch's plan depends on (plan.seed, epoch)
and not on the world size, so the global batches are the same on 1 or 64 workers. To resume,
pass the next step as `start_step`. A rank's share of a small bucket's last batch can be empty
(B = 0): `batch_tensors` then returns a one-row batch with no supervised token, so the rank
still takes part in every DDP collective. `labels` are aligned with `input_ids` (shift them
by one for next-token loss) and are -100 on padding and on unsupervised tokens.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from pipeline.core.collate import IGNORE_INDEX
from pipeline.core.config import ConfigError, RunConfig
from pipeline.core.epochs import resolve_edges
from pipeline.core.plan import steps_per_epoch
from pipeline.data.feeder import start_feeder, stop_feeder
from pipeline.data.index import build_length_index, resolve_data_path
from pipeline.data.rechunk import MicroBatch
from pipeline.data.stream import rank_batches

__all__ = [
    "Delivery",
    "MicroBatch",
    "batch_tensors",
    "iter_micro_batches",
    "prepare_delivery",
    "stop_delivery",
]


@dataclass(frozen=True)
class Delivery:
    """What a worker needs to read its micro-batches: plain values, safe to send to workers."""

    feeder: str  # name of the feeder actor
    path: str  # the data (directory or URI)
    edges: list[int]  # bucket edges [0, e1, ..., top]; bucket k holds lengths in (e_k, e_k+1]
    steps_per_epoch: int  # global steps per epoch (the same for every epoch and world size)
    num_samples: int  # valid samples in one epoch

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Delivery:
        return cls(**d)


def prepare_delivery(cfg: RunConfig, *, name: str | None = None) -> Delivery:
    """Driver side: find (or build) the data, index it, choose the edges, start the feeder.

    Call after `ray.init`; the feeder lives until `stop_delivery` or the end of the driver.
    """
    path = resolve_data_path(cfg)
    index = build_length_index(cfg, path)
    edges = [int(e) for e in resolve_edges(cfg, index.lengths)]
    steps = steps_per_epoch(index.lengths, edges, cfg.batching)
    if steps == 0:
        raise ConfigError(
            f"no training steps: {len(index.lengths)} valid samples under buckets {edges}"
        )
    name = name or f"bucketray-feeder-{uuid.uuid4().hex[:8]}"
    start_feeder(cfg, index, edges, name=name, path=path)
    return Delivery(name, path, edges, steps, int(len(index.lengths)))


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
    if not 0 <= start_step <= delivery.steps_per_epoch:
        raise ValueError(
            f"start_step={start_step} is outside the epoch's 0..{delivery.steps_per_epoch} steps"
        )
    yield from rank_batches(
        delivery.feeder,
        epoch=epoch,
        start_step=start_step,
        rank=rank,
        world_size=world_size,
        pin_memory=pin_memory,
    )


def batch_tensors(mb: MicroBatch, device=None) -> dict:
    """The micro-batch's tensors on `device`: input_ids, attention_mask, position_ids, labels
    (int64 [B, L]). An empty micro-batch becomes a 1 x 2 batch whose labels are all -100."""
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
