"""Run length: steps per epoch, total global steps and total optimizer steps, in one place.

A GLOBAL step is one step of an epoch plan (every rank trains one micro-batch); `train.max_steps`,
`train.log_every` and `checkpoint.every_steps` count them. An OPTIMIZER step is `train.grad_accum`
global steps, a group never spanning an epoch boundary; `train.warmup_steps` and the LR schedule
count them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.core.config import TrainConfig

__all__ = ["RunLength", "run_length"]


@dataclass(frozen=True)
class RunLength:
    steps_per_epoch: int  # global steps in one epoch (the same every epoch)
    global_steps: int  # global steps of the whole run: all epochs, cut at train.max_steps
    optimizer_steps: int  # optimizer steps of the whole run

    @property
    def epochs(self) -> int:
        """Epochs the run touches (the last one possibly cut short by train.max_steps)."""
        return math.ceil(self.global_steps / self.steps_per_epoch)


def run_length(steps_per_epoch: int, train: TrainConfig) -> RunLength:
    """The run's length from the plan's steps per epoch and train.epochs / max_steps / grad_accum."""
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    total = steps_per_epoch * train.epochs
    if train.max_steps is not None:
        total = min(total, train.max_steps)
    full_epochs, rest = divmod(total, steps_per_epoch)
    per_epoch = -(-steps_per_epoch // train.grad_accum)
    optimizer = full_epochs * per_epoch + -(-rest // train.grad_accum)
    return RunLength(steps_per_epoch, total, optimizer)
