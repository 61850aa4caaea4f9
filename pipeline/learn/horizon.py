"""The LR schedule's horizon across a resume.

The cosine schedule decays over the run's optimizer steps. A resume under another run length
(`train.max_steps` or `train.epochs` raised to train on) would rebuild it over the new total,
and the learning rate at the resumed step would jump (from the floor of a finished schedule to
most of the peak). Every checkpoint records the horizon it trained under (`schedule_steps` in
its optimizer settings); a resume whose horizon moves the LR curve is refused naming the jump,
unless `train.on_schedule_change` says `keep` (the checkpoint's schedule goes on: past its end
the cosine stays at its floor) or `recompute` (the new length's, jump and all).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.config import TrainConfig
from pipeline.learn.checkpoint import ResumeError
from pipeline.learn.optim import lr_factor

__all__ = ["SCHEDULE_STEPS", "HorizonChange", "horizon_change", "schedule_horizon"]

# The key of a checkpoint's optimizer settings holding the schedule's horizon.
SCHEDULE_STEPS = "schedule_steps"


@dataclass(frozen=True)
class HorizonChange:
    """The checkpoint's horizon `old`, this run's `new`, and the LR at optimizer step `at` (the
    next one) under each."""

    old: int
    new: int
    at: int
    lr_old: float
    lr_new: float

    def jump(self) -> str:
        ratio = f" ({self.lr_new / self.lr_old:.1f}x)" if self.lr_old > 0 else ""
        return (
            f"the LR at optimizer step {self.at} would go from {self.lr_old:.2e} to "
            f"{self.lr_new:.2e}{ratio}"
        )


def horizon_change(
    recorded: dict | None, train: TrainConfig, total: int, done: int
) -> HorizonChange | None:
    """How this config's run length (`total` optimizer steps) moves the LR schedule the
    checkpoint recorded, at optimizer step `done`; None when it does not (same horizon, an
    older checkpoint without one, a constant schedule whose warmup does not depend on it)."""
    if not recorded or recorded.get(SCHEDULE_STEPS) is None:
        return None
    old = int(recorded[SCHEDULE_STEPS])
    if old == total:
        return None
    if train.schedule != "cosine" and train.warmup_for(old) == train.warmup_for(total):
        return None

    def lr(horizon: int) -> float:
        f = lr_factor(
            done,
            warmup=train.warmup_for(horizon),
            total=horizon,
            schedule=train.schedule,
            min_ratio=train.min_lr_ratio,
        )
        return train.lr * f

    return HorizonChange(old, total, done, lr(old), lr(total))


def schedule_horizon(
    change: HorizonChange | None, train: TrainConfig, where: str = ""
) -> tuple[int | None, str | None]:
    """(the horizon to build the schedule over, None: this run's; the line saying so) under
    train.on_schedule_change; `error` refuses a changed horizon in one line."""
    if change is None:
        return None, None
    mode = train.on_schedule_change
    if mode == "keep":
        return change.old, (
            f"train.on_schedule_change=keep: this run of {change.new} optimizer steps keeps the "
            f"checkpoint's LR schedule over {change.old} optimizer steps"
        )
    if mode == "recompute":
        return None, (
            f"train.on_schedule_change=recompute: the LR schedule is recomputed over "
            f"{change.new} optimizer steps (the checkpoint's ran over {change.old}): {change.jump()}"
        )
    raise ResumeError(
        f"cannot resume{where}: the LR schedule of the checkpoint ran over {change.old} "
        f"optimizer steps, this run is {change.new} (train.max_steps / train.epochs), and "
        f"recomputed over it {change.jump()}; set train.on_schedule_change=keep to continue the "
        "checkpoint's schedule (past its end the LR stays at its floor), or "
        "train.on_schedule_change=recompute to take the new one"
    )
