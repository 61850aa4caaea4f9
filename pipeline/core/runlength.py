"""Run length: steps per epoch, total global steps and total optimizer steps, in one place.

A GLOBAL step is one step of an epoch plan (every rank trains one micro-batch); `train.max_steps`,
`train.log_every` and `checkpoint.every_steps` count them. An OPTIMIZER step is `train.grad_accum`
global steps, a group never spanning an epoch boundary; `train.warmup_steps` and the LR schedule
count them. With `batching.fill: greedy` each epoch's plan has its own number of steps, so the
run length takes either one count for every epoch or each epoch's planned count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core.config import TrainConfig

__all__ = ["RunLength", "run_length"]


@dataclass(frozen=True)
class RunLength:
    steps_per_epoch: tuple[int, ...]  # global steps of each epoch the run touches
    global_steps: int  # global steps of the whole run: all epochs, cut at train.max_steps
    optimizer_steps: int  # optimizer steps of the whole run

    @property
    def epochs(self) -> int:
        """Epochs the run touches (the last one possibly cut short by train.max_steps)."""
        return len(self.steps_per_epoch)


def run_length(steps_per_epoch: int | Sequence[int], train: TrainConfig) -> RunLength:
    """The run's length from the plan's steps per epoch (one count for every epoch, or each
    epoch's planned count, covering at least the epochs the run reaches) and train.epochs /
    max_steps / grad_accum."""
    if isinstance(steps_per_epoch, int):
        planned = [steps_per_epoch] * train.epochs
    else:
        planned = [int(s) for s in steps_per_epoch][: train.epochs]
    if any(s < 1 for s in planned):
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    cap = train.max_steps
    touched, total, optimizer = [], 0, 0
    for s in planned:
        if cap is not None and total >= cap:
            break
        take = s if cap is None else min(s, cap - total)
        touched.append(s)
        total += take
        optimizer += -(-take // train.grad_accum)
    if len(planned) < train.epochs and (cap is None or total < cap):
        raise ValueError(
            f"steps_per_epoch covers {len(planned)} of the {train.epochs} epochs the run reaches"
        )
    return RunLength(tuple(touched), total, optimizer)
