"""What the feeder hands a worker for one (epoch, world size, start step, rank), and its checks.

A part covers one range of the epoch (a chapter, or a lead-in's range: `pipeline.core.ranges`),
from the start step asked for to the range's end (`end_step`); the worker asks for the next part
from there.

One frozen object instead of a loose dict: the rank's plan view, the ordered refs of its sorted
blocks, what padding needs, and the identity of the plan it was cut from. The worker checks that
identity before it trains on a row: the part must answer its own request, and the plan's hash
must equal the one the driver planned (and the checkpoint recorded), so a feeder serving another
config, index or edges is refused instead of silently delivering a different order.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.plan import RankView

__all__ = ["RankPart", "PlanMismatchError", "WrongPartError"]


class PlanMismatchError(RuntimeError):
    """The feeder's plan is not the one this worker was told to train on."""


class WrongPartError(RuntimeError):
    """The feeder answered another request than the one asked (a bug in the feeder): raised,
    not asserted, so it holds under `python -O` too and no rank trains on another's rows."""


@dataclass(frozen=True, eq=False)
class RankPart:
    """Rank `rank`'s share of one prepared range: plan rows of steps [start_step, end_step)."""

    epoch: int
    world_size: int
    start_step: int
    rank: int
    prep_id: str  # which preparation of this key the blocks come from
    plan_hash: str  # content hash of the whole epoch's plan (EpochPlan.content_hash)
    view: RankView  # the rank's rows, micro-batches and steps of [start_step, end_step)
    refs: tuple  # ObjectRefs of the rank's sorted blocks, in plan order
    edges: tuple[int, ...]
    pad_id: int
    pad_to_multiple_of: int
    supervision: str  # "", "loss_mask" or "labels": what the blocks' `sup` column holds
    end_step: int  # the part's range ends here (exclusive); the next part starts here
    epoch_steps: int  # global steps in the epoch: the last part ends there
    read_retries: int = 0  # transient read errors retried while preparing this epoch
    # Where `view` and `refs` begin when they were prepared for an earlier start (a range the
    # feeder still held, served to ranks restarting inside it): the stream skips the steps
    # [first_step, start_step). None: they begin at start_step.
    first_step: int | None = None

    @property
    def skip_steps(self) -> int:
        """Micro-batches of `view` before `start_step` (one per step), checked but not padded."""
        return 0 if self.first_step is None else self.start_step - self.first_step

    def check(
        self,
        *,
        epoch: int,
        world_size: int,
        start_step: int,
        rank: int,
        plan_hash: str | None = None,
    ) -> None:
        """Raise unless this part answers (epoch, world_size, start_step, rank) of `plan_hash`."""
        got = (self.epoch, self.world_size, self.start_step, self.rank, self.view.rank)
        want = (epoch, world_size, start_step, rank, rank)
        if got != want:
            raise WrongPartError(f"feeder answered {got} to the request {want}")
        if plan_hash is not None and plan_hash != self.plan_hash:
            raise PlanMismatchError(
                f"epoch {epoch}: the feeder's plan has hash {self.plan_hash}, this run planned "
                f"{plan_hash}: the feeder was started from another config, index or edges than "
                "the training run (or the data changed between them); start both from one driver "
                "(python -m jobs.train) and the hashes agree"
            )
