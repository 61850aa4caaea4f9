"""One rank's training run, without Ray: resume, step, maybe_log, maybe_checkpoint.

The trainer gets its micro-batches from a `batches(epoch, start_step)` function and hands each
checkpoint directory to a `save(directory, metrics, name)` function; the Ray Train loop
(`pipeline.train.loop`) plugs in the data layer and `ray.train.report`, and tests plug in lists
and a folder. A checkpoint stores the data position (epoch, next step), and a restart asks for
exactly the remaining steps (contract 7).

A non-finite loss or gradient norm skips the update and, past train.max_nonfinite_steps in a
row, raises NonFiniteLossError; no checkpoint is written while the state may be non-finite.
A stop request (`stop()` true on any rank) ends the run after the current step with a
checkpoint, at the same step on every rank; a driver found gone (`stop()` raising
DriverGoneError) ends it on every rank without one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pipeline.core.config import RunConfig
from pipeline.core.metrics import BucketLossTracker
from pipeline.core.runlength import run_length
from pipeline.learn.checkpoint import DataPosition, global_batch_definition
from pipeline.learn.horizon import SCHEDULE_STEPS
from pipeline.learn.logger import ELAPSED_S, REAL_TOKENS, MetricLogger, NullLogger, run_id_for
from pipeline.learn.loss import NonFiniteGuard
from pipeline.learn.model_check import ModelBuildError, build_model_or_refuse
from pipeline.learn.model_record import model_record
from pipeline.learn.optim import (
    build_optimizer,
    build_scheduler,
    compiled,
    master_weights,
    optimizer_settings,
)
from pipeline.learn.packed_attention import require_packed_support
from pipeline.train.checkpointing import Checkpointing, seed_worker
from pipeline.train.evaluation import EvalBatchesFn, Evaluator, eval_line
from pipeline.train.faults import maybe_fail
from pipeline.train.history import EvalHistory, StepHistory
from pipeline.train.prefetch import prefetch_batches
from pipeline.train.progress import (
    SampleRecorder,
    Window,
    packed_step_metrics,
    progress_line,
    range_metrics,
    step_metrics,
)
from pipeline.train.reference import reference_clause, reference_metrics
from pipeline.train.runspec import BatchesFn, RunSpec, SaveFn, crossed
from pipeline.train.step import GroupStats, train_group
from pipeline.train.stop import DriverGoneError

__all__ = ["PREFETCH_AHEAD", "RunSpec", "Trainer", "UnusedParametersError", "seed_worker"]

# Micro-batches the stream prepares ahead of the step (at least one optimizer step's worth).
PREFETCH_AHEAD = 2


def _take(it: Iterator, n: int) -> tuple[list, float]:
    """Up to n items from `it`, and the seconds spent waiting for them."""
    t0 = time.perf_counter()
    out = []
    for _ in range(n):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out, time.perf_counter() - t0


class UnusedParametersError(RuntimeError):
    """DDP found parameters that got no gradient while train.find_unused_parameters is false.
    Not retryable: every restart trains the same model the same way."""

    retryable = False


def unused_parameters_error(e: RuntimeError) -> RuntimeError:
    """DDP's unused-parameter error as one line naming the config field; any other error as is."""
    if "find_unused_parameters" not in str(e):
        return e
    return UnusedParametersError(
        "the model has parameters that received no gradient in a step (DDP with "
        "train.find_unused_parameters=false): set train.find_unused_parameters=true, or remove "
        "the unused parameters from the model"
    )


class Trainer(Checkpointing):
    """One rank's run: `resume(state)`, then `fit(batches, logger)`; `step`, `maybe_log`,
    `maybe_evaluate` and `maybe_checkpoint` are its parts, in that order for every optimizer
    step (resume and checkpoints: `pipeline.train.checkpointing`)."""

    def __init__(
        self,
        cfg: RunConfig,
        spec: RunSpec,
        *,
        save: SaveFn,
        recorder: SampleRecorder | None = None,
        stop: Callable[[], bool] | None = None,
        eval_batches: EvalBatchesFn | None = None,
    ):
        self.cfg, self.spec, self.save, self.stop = cfg, spec, save, stop
        self.recorder = recorder or SampleRecorder(None, spec.rank)
        t = cfg.train
        length = run_length(spec.steps_per_epoch, t)
        self.total_steps = length.global_steps
        self.global_batch = global_batch_definition(cfg, spec.edges)
        self.bf16 = t.bf16 == "on" or (t.bf16 == "auto" and spec.device.type == "cuda")
        # Same init on every rank (DDP also broadcasts rank 0's).
        torch.manual_seed(t.seed)
        model = build_model_or_refuse(cfg.model, max_positions=spec.edges[-1])
        # fp32 master weights whatever the checkpoint's dtype: bf16 only through autocast.
        self.model = master_weights(model, cfg.model).to(spec.device)
        self.row_tokens = getattr(cfg.batching, "row_tokens", 0)  # packed rows; 0: padded
        if self.row_tokens:
            try:
                require_packed_support(self.model)
            except ValueError as e:  # a ConfigError: Ray Train raises it at once, no retries
                raise ModelBuildError(str(e)) from None
        self.model_record = model_record(cfg.model)  # recorded with every checkpoint
        self.evaluator = None  # held-out evaluation (cfg.eval), over this rank's eval_batches()
        if cfg.eval is not None and eval_batches is not None:
            self.evaluator = Evaluator(
                cfg.eval,
                eval_batches,
                edges=spec.edges,
                device=spec.device,
                bf16=self.bf16,
                ranges=spec.ranges,  # the held-out loss by the training loss's length ranges
            )
        self.optimizer = build_optimizer(self.model, t)
        self.scheduler = build_scheduler(self.optimizer, t, length.optimizer_steps)
        # The schedule's horizon is recorded too: a resume under another run length is checked
        # against it (pipeline.learn.horizon).
        self.settings = {
            **optimizer_settings(t, length.optimizer_steps),
            SCHEDULE_STEPS: length.optimizer_steps,
        }
        self.tracker = BucketLossTracker(len(spec.edges) - 1)
        self.guard = NonFiniteGuard(t.max_nonfinite_steps)
        self.position = DataPosition(
            0, 0, spec.epochs[0]["hash"], spec.world, self.global_batch, 0, spec.data_files
        )
        self.counters = {"updates": 0, "tokens": 0.0, "padded": 0.0, "samples": 0.0}
        self.run_id = run_id_for(spec.run_dir)
        self.steps_done = 0
        self.last_loss = float("nan")
        self.logger: MetricLogger = NullLogger()
        self.window = Window()
        self.ddp = self.model  # wrapped in DDP by fit() under a process group
        self.lr = self.grad_norm = self.debiased = float("nan")  # of the last step
        self.history = StepHistory()  # rank 0's record of every global step, saved in checkpoints
        self.evals = EvalHistory()  # every held-out evaluation, saved in checkpoints
        self.validate_next = False  # eval.mode=async: the next checkpoint is to be evaluated
        self.stop_flags = np.zeros(2)  # the last step's (asked, driver gone), summed over ranks
        self.driver_gone: DriverGoneError | None = None  # this rank's own finding
        self.last_step_end = time.perf_counter()

    def steps_in(self, epoch: int) -> int:
        """The planned global steps of `epoch` (0 past the epochs the run reaches)."""
        return self.spec.steps_in(epoch)

    # ---- run -> epoch -> step
    def fit(self, batches: BatchesFn, logger: MetricLogger) -> str:
        """Train to the end of the run ("done") or to a stop request ("stopped")."""
        self.logger = logger
        self.recorder.start(self.position.epoch, self.position.next_step)
        use_ddp = dist.is_available() and dist.is_initialized()
        cuda = self.spec.device.type == "cuda"
        self.ddp = (
            DistributedDataParallel(
                self.model,
                device_ids=[self.spec.device] if cuda else None,
                find_unused_parameters=self.cfg.train.find_unused_parameters,
            )
            if use_ddp
            else self.model
        )
        if self.cfg.train.compile:  # the step's forward; checkpoints save the plain self.model
            self.ddp = compiled(self.ddp)
        self.run_t0, self.run_steps0 = time.perf_counter(), self.steps_done
        self.last_step_end = self.run_t0
        status = "done"
        e = self.cfg.eval
        first = self.steps_done == 0 and 0 not in self.evals.steps()
        if e is not None and e.at_start and first:
            self.evaluate(self.position.epoch)
            if self.validate_next:  # eval.mode=async: the untrained weights, checkpointed
                self.checkpoint(self.position.epoch, self.position.next_step)
        try:
            for epoch in range(self.position.epoch, self.cfg.train.epochs):
                if self.steps_done >= self.total_steps:
                    break
                if not self.run_epoch(epoch, batches):
                    status = "stopped"
                    break
        except RuntimeError as e:
            err = unused_parameters_error(e)
            if err is e:
                raise
            raise err from e
        self.logger.finish()
        return status

    def run_epoch(self, epoch: int, batches: BatchesFn) -> bool:
        """Train `epoch` from the resume position on; False when a stop request ended it."""
        S = self.steps_in(epoch)
        start = self.position.next_step if epoch == self.position.epoch else 0
        if start == 0:
            metrics = {"epoch/index": epoch, **self.spec.epochs[epoch]["metrics"]}
            self.logger.log(metrics, step=self.steps_done)
        # The stream runs ahead on a thread of its own (collation, pinning, the copy to the
        # device), closed on every way out of the epoch.
        ahead = max(PREFETCH_AHEAD, self.cfg.train.grad_accum)
        with prefetch_batches(batches(epoch, start), device=self.spec.device, ahead=ahead) as it:
            last_step = self.train_steps(it, epoch, start - 1)
        if last_step is None:
            return False
        if last_step == S - 1:
            return True
        if self.steps_done < self.total_steps:
            raise RuntimeError(
                f"the data layer ended epoch {epoch} on rank {self.spec.rank} after step "
                f"{last_step}, but the plan has {S} steps"
            )
        return True

    def train_steps(self, it: Iterator, epoch: int, last_step: int) -> int | None:
        """Optimizer steps over `it` to the epoch's or the run's end: the last global step
        trained (the stream may end early), None when a stop request ended the run."""
        S = self.steps_in(epoch)
        while self.steps_done < self.total_steps:
            group, wait_s = _take(
                it, min(self.cfg.train.grad_accum, self.total_steps - self.steps_done)
            )
            if not group:
                break
            before = self.steps_done
            # Before a checkpoint the stop poll asks afresh: a driver gone means no checkpoint
            # that nobody would register (the conditions of checkpoint_due, after this group).
            after = before + len(group)
            fresh = (
                group[-1].step == S - 1
                or after == self.total_steps
                or crossed(before, after, self.cfg.checkpoint.every_steps)
            )
            stats = self.step(group, epoch, wait_s, fresh_stop=fresh)
            self.maybe_log(stats, before, epoch)
            last_step = stats.steps[-1]
            self.maybe_evaluate(before, epoch, epoch_end=last_step == S - 1)
            stop = self.stop_requested()
            self.maybe_checkpoint(before, epoch, last_step + 1, stop=stop)
            maybe_fail(self.steps_done, self.spec.rank)
            if stop:
                return None
            if last_step == S - 1:
                break
        return last_step

    def step(
        self, group: list, epoch: int, wait_s: float = 0.0, *, fresh_stop: bool = False
    ) -> GroupStats:
        """One optimizer step over `group` (one micro-batch per global step). Its one
        host-device synchronisation brings back the step's figures, the gradient norm and every
        rank's stop flags together (`train_group`); rank 0's stop poll runs while the device
        computes the backward."""
        t, spec = self.cfg.train, self.spec
        clip = t.grad_clip if t.grad_clip > 0 else float("inf")
        stats = train_group(
            self.ddp,
            group,
            device=spec.device,
            world_size=spec.world,
            bf16=self.bf16,
            clip=(self.model.parameters(), clip),
            extra=lambda: self.poll_stop(fresh_stop),
            ranges=spec.ranges,
        )
        self.grad_norm, self.stop_flags = stats.grad_norm, stats.extra
        self.lr = self.scheduler.get_last_lr()[0]
        losses = [stats.step_loss(i) for i in range(len(group))]
        finite = self.guard.check(
            step_losses=losses,
            grad_norm=self.grad_norm,
            steps=stats.steps,
            buckets=stats.buckets,
            sample_ids=stats.sample_ids,
            epoch=epoch,
            rank=spec.rank,
        )
        if finite:
            self.optimizer.step()
            self.counters["updates"] += 1
        self.scheduler.step()  # the LR stays a function of the data position
        self.optimizer.zero_grad(set_to_none=True)

        self.steps_done += len(group)
        self.counters["tokens"] += float(stats.real.sum())
        self.counters["padded"] += float(stats.padded.sum())
        self.counters["samples"] += float(stats.samples.sum())
        debiased = [float("nan")] * len(group)
        if finite:
            debiased = [self.tracker.update(b, losses[i]) for i, b in enumerate(stats.buckets)]
        self.debiased = debiased[-1]
        self.last_loss = losses[-1]
        now = time.perf_counter()
        per_step_s = (now - self.last_step_end) / len(group)
        self.last_step_end = now
        self.history.range_edges = self.history.range_edges or list(spec.ranges)
        for i, b in enumerate(stats.buckets):
            self.history.append(
                step=self.steps_done - len(group) + i + 1,
                epoch=epoch,
                bucket=b,
                loss=losses[i],
                debiased=debiased[i],
                lr=self.lr,
                real=float(stats.real[i]),
                padded=float(stats.padded[i]),
                seconds=per_step_s,
                range_loss=stats.range_loss[i] if spec.ranges else (),
                range_tokens=stats.range_tokens[i] if spec.ranges else (),
                noise=float(stats.noise[i]) if stats.noise.size else float("nan"),
            )
        self.recorder.record(epoch, stats)
        self.window.add(stats, wait_s)
        return stats

    def maybe_log(self, stats: GroupStats, before: int, epoch: int) -> None:
        """Metrics and rank 0's console line every train.log_every global steps and at the end."""
        done, total = self.steps_done, self.total_steps
        if not (crossed(before, done, self.cfg.train.log_every) or done == total):
            return
        m = step_metrics(
            stats, lr=self.lr, grad_norm=self.grad_norm, debiased=self.debiased, epoch=epoch
        )
        m.update(range_metrics(stats, self.spec.ranges))
        m.update(self.axes())
        m.update(self.window.metrics())
        if self.row_tokens:
            m.update(packed_step_metrics(stats, self.row_tokens))
        self.logger.log(m, step=done)
        if self.spec.rank == 0:
            rate = (done - self.run_steps0) / max(time.perf_counter() - self.run_t0, 1e-9)
            line = progress_line(
                steps_done=done,
                total_steps=total,
                epoch=epoch,
                epoch_step=stats.steps[-1] + 1,
                steps_per_epoch=self.steps_in(epoch),
                loss=self.last_loss,
                tokens_per_s=m["data/real_tokens_per_s"],
                rate=rate,
            )
            print(line, flush=True)
        self.window.reset()

    def maybe_evaluate(self, before: int, epoch: int, *, epoch_end: bool) -> None:
        """Evaluate on the held-out set where `eval:` asks, after the step's log and before its
        checkpoint (so a checkpoint holds the evaluations of its own step)."""
        if self.cfg.eval is None:
            return
        run_end = self.steps_done == self.total_steps
        if self.cfg.eval.due(before, self.steps_done, epoch_end=epoch_end, run_end=run_end):
            self.evaluate(epoch)

    def evaluate(self, epoch: int) -> dict[str, float]:
        """One held-out evaluation of the current weights on every rank: recorded, logged and,
        on rank 0, printed. Its time counts neither as a step's nor in tokens per second. With
        eval.mode=async it is asked of Ray Train instead: this step's checkpoint (written now)
        is evaluated by a task of its own (`pipeline.train.evaluate_run.validate_checkpoint`)."""
        if self.cfg.eval.mode == "async":
            self.validate_next = True
            return {}
        if self.evaluator is None:
            return {}
        m = self.evaluator.run(self.model)
        done, secs = self.steps_done, m["eval/seconds"]
        self.evals.append(done, epoch, m, self.evaluator.num_buckets, secs, self.evaluator.ranges)
        axes = self.axes()
        m.update(reference_metrics(self.spec.reference, axes[REAL_TOKENS], m["eval/loss"]))
        self.logger.log({**m, **axes}, step=done)
        if self.spec.rank == 0:
            line = eval_line(done, epoch, m) + reference_clause(self.spec.reference, m)
            print(line, flush=True)
        self.window.t0 += secs
        self.last_step_end += secs
        return m

    def axes(self) -> dict[str, float]:
        """Where the run is in real tokens and seconds of training steps (W&B's x axes,
        `pipeline.learn.logger.define_axes`), from the step history: the same after a resume."""
        return {
            REAL_TOKENS: float(np.sum(self.history.rows["real"])),
            ELAPSED_S: float(np.sum(self.history.rows["seconds"])),
        }

    def poll_stop(self, fresh: bool = False) -> tuple[float, float]:
        """This rank's (asked to stop, found the driver gone) for the step's all-reduce;
        `fresh` asks the poller now rather than at its own pace."""
        self.driver_gone = None
        if self.stop is None:
            return 0.0, 0.0
        try:
            ask = getattr(self.stop, "fresh", None) if fresh else None
            return (1.0 if (ask or self.stop)() else 0.0), 0.0
        except DriverGoneError as e:
            self.driver_gone = e
            return 0.0, 1.0

    def stop_requested(self) -> bool:
        """Whether any rank was asked to stop at the last step: the flags were summed over all
        ranks with the step's figures, so all stop together. A rank whose poll found the driver
        gone (DriverGoneError) makes every rank raise it, before any checkpoint."""
        asked, gone = (float(v) for v in self.stop_flags)
        if gone > 0:
            raise self.driver_gone or DriverGoneError("another rank found the run's driver gone")
        return asked > 0
