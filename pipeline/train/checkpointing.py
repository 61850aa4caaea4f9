"""A rank's checkpoints: resuming from one (contract 7), when one falls, and what it holds.

The checkpoint half of `pipeline.train.trainer.Trainer`, which inherits it and owns the state it
reads. `resume` continues from this rank's view of the latest checkpoint, checked against the
run's plan, world size, data files and model; `maybe_checkpoint` writes one at an epoch end, at
the run's end, every checkpoint.every_steps global steps and on a stop request, never while the
last step was non-finite. A checkpoint stores the data position (epoch, next step), so a
restart asks for exactly the remaining steps.
"""

from __future__ import annotations

import tempfile
import time

import numpy as np
import torch

from pipeline.core.config import RunConfig
from pipeline.core.metrics import BucketLossTracker
from pipeline.learn.checkpoint import (
    DataPosition,
    TrainState,
    check_resume,
    rng_state,
    save_checkpoint,
    save_run_config,
    set_rng_state,
)
from pipeline.learn.horizon import SCHEDULE_STEPS, horizon_change, schedule_horizon
from pipeline.learn.logger import MetricLogger
from pipeline.learn.loss import NonFiniteGuard
from pipeline.learn.model_record import check_same_model, load_weights
from pipeline.learn.optim import build_scheduler, load_with_current_settings, optimizer_settings
from pipeline.train.history import EvalHistory, StepHistory
from pipeline.train.runspec import RunSpec, SaveFn, crossed

__all__ = ["Checkpointing", "seed_worker"]


def seed_worker(seed: int, rank: int, steps_done: int) -> None:
    """Per-rank dropout RNG from a seed tuple (never seed + rank, which collides)."""
    s = int(np.random.SeedSequence((seed, rank, steps_done)).generate_state(1)[0])
    torch.manual_seed(s)


class Checkpointing:
    """Resume and checkpoint writing for a Trainer, over the trainer's own state."""

    # Set by Trainer.__init__ (and replaced by resume where a checkpoint says otherwise).
    cfg: RunConfig
    spec: RunSpec
    save: SaveFn
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    settings: dict
    model_record: dict
    global_batch: dict
    tracker: BucketLossTracker
    guard: NonFiniteGuard
    logger: MetricLogger
    position: DataPosition
    counters: dict
    run_id: str
    steps_done: int
    total_steps: int
    last_loss: float
    history: StepHistory
    evals: EvalHistory
    validate_next: bool

    def resume(
        self,
        state: TrainState | None,
        history: StepHistory | None = None,
        evals: EvalHistory | None = None,
    ) -> None:
        """Continue from `state` (this rank's view of the latest checkpoint) and the step history
        and evaluations saved with it, or start fresh."""
        spec = self.spec
        if state is None:
            seed_worker(self.cfg.train.seed, spec.rank, 0)
            return
        p = state.position
        if p.epoch < len(spec.epochs):
            check_resume(
                p,
                global_batch=self.global_batch,
                plan_hash=spec.epochs[p.epoch]["hash"],
                world_size=spec.world,
                on_world_size_change=self.cfg.plan.on_world_size_change,
                data_files=spec.data_files,
            )
        check_same_model(state.model_record, self.model_record)
        load_weights(self.model, state.model)
        self._schedule_horizon(state)
        # The moments and the schedule's position from the checkpoint, the settings from this
        # config: a resume with a lower train.lr trains at it, and says so.
        changed = load_with_current_settings(
            self.optimizer,
            self.scheduler,
            state.optimizer,
            state.scheduler,
            state.train_record,
            {k: v for k, v in self.settings.items() if k != SCHEDULE_STEPS},
        )
        if changed and spec.rank == 0:
            print(
                f"[bucketray] resuming with new optimizer settings: {', '.join(changed)}",
                flush=True,
            )
        self.tracker.load_state_dict(state.tracker)
        self.counters, self.run_id = dict(state.counters), state.wandb_run_id
        self.position = p.normalized(spec.steps_in(p.epoch))
        self.steps_done = p.steps_done
        if history is not None:
            history.truncate(p.steps_done)
            self.history = history
        if evals is not None:
            evals.truncate(p.steps_done)
            self.evals = evals
        if state.rng is not None and p.world_size == spec.world:
            set_rng_state(state.rng)
        else:
            seed_worker(self.cfg.train.seed, spec.rank, p.steps_done)
        if spec.rank == 0:
            print(
                f"[bucketray] resuming at epoch {self.position.epoch} step "
                f"{self.position.next_step} ({p.steps_done} global steps done, written by "
                f"{p.world_size} workers)",
                flush=True,
            )

    def _schedule_horizon(self, state: TrainState) -> None:
        """A resume under another run length: refused, or the schedule rebuilt over the
        checkpoint's horizon (train.on_schedule_change; the driver printed the line)."""
        t = self.cfg.train
        done = int((state.scheduler or {}).get("last_epoch", 0))
        change = horizon_change(state.train_record, t, self.settings[SCHEDULE_STEPS], done)
        horizon, _ = schedule_horizon(change, t)
        if horizon is not None:
            self.scheduler = build_scheduler(self.optimizer, t, horizon)
            self.settings = {**optimizer_settings(t, horizon), SCHEDULE_STEPS: horizon}

    def checkpoint_due(self, before: int, epoch: int, next_step: int) -> bool:
        """A checkpoint falls after this step: an epoch end, the run's end, or every
        checkpoint.every_steps global steps (a stop request adds one)."""
        done = self.steps_done
        return (
            next_step == self.spec.steps_in(epoch)
            or done == self.total_steps
            or crossed(before, done, self.cfg.checkpoint.every_steps)
        )

    def maybe_checkpoint(self, before: int, epoch: int, next_step: int, stop: bool) -> None:
        """Checkpoint at an epoch end, the run's end, every checkpoint.every_steps global steps
        and on a stop request; never while the last step was non-finite."""
        done = self.steps_done
        if not (stop or self.validate_next or self.checkpoint_due(before, epoch, next_step)):
            return
        if self.guard.streak > 0:
            if self.spec.rank == 0:
                print(
                    f"[bucketray] no checkpoint at step {done}: its loss is not finite", flush=True
                )
            return
        self.checkpoint(epoch, next_step, stopped=stop)

    def checkpoint(self, epoch: int, next_step: int, stopped: bool = False) -> None:
        """Write this rank's part of a checkpoint at (epoch, next_step) and hand it to `save`
        (rank 0 adds the step history, the evaluations and the run's config)."""
        t0, done = time.perf_counter(), self.steps_done
        pos = DataPosition(
            epoch,
            next_step,
            self.spec.epochs[epoch]["hash"],
            self.spec.world,
            self.global_batch,
            done,
            self.spec.data_files,
        )
        state = TrainState(
            model=self.model.state_dict(),
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(),
            position=pos,
            wandb_run_id=self.run_id,
            counters=self.counters,
            tracker=self.tracker.state_dict(),
            rng=rng_state(),
            model_record=self.model_record,
            train_record=self.settings,
        )
        with tempfile.TemporaryDirectory(prefix="bucketray-ckpt-") as d:
            if self.spec.rank == 0:
                self.history.write(d)
                self.evals.write(d)
                save_run_config(d, self.cfg)
            save_checkpoint(d, state, rank=self.spec.rank)
            name = f"checkpoint_step{done:08d}"
            metrics = self._checkpoint_metrics(epoch, next_step, stopped)
            if self.validate_next:
                self.save(d, metrics, name, validation={"step": done, "epoch": epoch})
            else:
                self.save(d, metrics, name)
            self.validate_next = False
        self.logger.log({"checkpoint/save_s": time.perf_counter() - t0}, step=done)

    def _checkpoint_metrics(self, epoch: int, next_step: int, stopped: bool) -> dict:
        """What Ray Train records beside a checkpoint."""
        c = self.counters
        return {
            "steps": self.steps_done,
            "epoch": epoch,
            "next_step": next_step,
            "tokens": c["tokens"],
            "samples": c["samples"],
            "loss": self.last_loss,
            "padding_efficiency": c["tokens"] / max(c["padded"], 1.0),
            "stopped": int(stopped),
        }
