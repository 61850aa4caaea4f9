"""What one rank knows about the run besides the config (its place, the plan's shape, the data),
and when a step crosses an every-N-steps mark (logging, checkpoints)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

__all__ = ["BatchesFn", "RunSpec", "SaveFn", "crossed"]

# (checkpoint directory, metrics, checkpoint name[, validation=task kwargs: eval.mode=async])
SaveFn = Callable[..., None]
BatchesFn = Callable[[int, int], Iterator]  # (epoch, start step) -> this rank's micro-batches


@dataclass(frozen=True)
class RunSpec:
    """What one rank knows about the run besides the config."""

    rank: int
    world: int
    device: torch.device
    edges: list[int]
    steps_per_epoch: list[int]  # planned global steps of each epoch the run reaches
    epochs: list[dict]  # per epoch: {"hash": plan hash, "metrics": {"epoch/...": ...}}
    run_dir: str  # the run's resolved storage directory: names its W&B run
    data_files: dict = field(default_factory=dict)  # per-shard digests (pipeline.core.manifest)
    # Edges of the length ranges the training loss is split by ([]: none; core.length_ranges).
    ranges: list[int] = field(default_factory=list)
    # eval.reference_run's held-out curve (pipeline.train.reference.reference_curve; {}: none).
    reference: dict = field(default_factory=dict)

    def steps_in(self, epoch: int) -> int:
        """The planned global steps of `epoch` (0 past the epochs the run reaches)."""
        planned = self.steps_per_epoch
        return planned[epoch] if epoch < len(planned) else 0


def crossed(before: int, after: int, every: int | None) -> bool:
    """Whether going from `before` to `after` global steps passed a multiple of `every`."""
    return every is not None and after // every > before // every
