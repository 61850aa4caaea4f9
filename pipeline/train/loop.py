"""The Ray Train worker loop: run -> epoch -> step, with honest loss, metrics and exact resume.

Every rank receives one micro-batch per global step from the data layer (`rank_batches`), all
from the same bucket; `train.grad_accum` global steps make one optimizer step. The loss of a
group is the sum of token losses over all ranks divided by the all-reduced number of supervised
tokens (contract 9). A rank whose micro-batch is empty still runs forward and backward, on a
one-row dummy whose loss weight is zero, so it joins every DDP collective (contracts 3 and 4).
A checkpoint stores the data position (epoch, next step), and a restart asks the data layer for
exactly the remaining steps (contract 7).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from pipeline.core.collate import IGNORE_INDEX
from pipeline.core.config import RunConfig
from pipeline.core.metrics import BucketLossTracker
from pipeline.core.runlength import run_length
from pipeline.learn.checkpoint import (
    DataPosition,
    TrainState,
    check_resume,
    global_batch_definition,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from pipeline.learn.logger import MetricLogger, make_logger, new_run_id
from pipeline.learn.loss import ddp_loss_scale, supervised_tokens, token_sums
from pipeline.learn.model import build_model
from pipeline.learn.optim import build_optimizer, build_scheduler

__all__ = [
    "LoopInputs",
    "GroupStats",
    "train_loop",
    "train_group",
    "FAIL_AT_STEP_ENV",
    "FAIL_MARKER_ENV",
    "FAIL_RANK_ENV",
]

# Fault injection for tests: fail every rank once, right after global step N has been trained
# (and checkpointed if due). The marker path makes it happen once per rank across restarts.
# BUCKETRAY_FAIL_RANK limits it to one rank (the others then wait in the next collective).
FAIL_AT_STEP_ENV = "BUCKETRAY_FAIL_AT_STEP"
FAIL_MARKER_ENV = "BUCKETRAY_FAIL_MARKER"
FAIL_RANK_ENV = "BUCKETRAY_FAIL_RANK"


@dataclass(frozen=True)
class LoopInputs:
    """What the driver hands every worker (as train_loop_config, a plain dict)."""

    cfg: dict  # RunConfig.model_dump(mode="json"); re-validated in the worker
    feeder: str  # name of the data layer's feeder actor
    edges: list[int]
    steps_per_epoch: int
    epochs: list[dict]  # per epoch: {"hash": plan hash, "metrics": {"epoch/...": ...}}
    wandb_dir: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class GroupStats:
    """One optimizer step's worth of global steps; every array is summed over all ranks."""

    steps: list[int]
    buckets: list[int]
    loss_sum: np.ndarray
    correct: np.ndarray
    tokens: np.ndarray  # supervised tokens
    real: np.ndarray  # real (unpadded) tokens
    padded: np.ndarray  # padded slots
    samples: np.ndarray
    sample_ids: list[np.ndarray] = field(default_factory=list)  # this rank's, per step

    def step_loss(self, i: int) -> float:
        return float(self.loss_sum[i] / max(self.tokens[i], 1))


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t


def _dummy_inputs(device: torch.device) -> dict[str, torch.Tensor]:
    """A 1 x 2 batch with no supervised token: forward/backward touch every parameter with a
    zero loss, so an empty micro-batch still takes part in DDP's gradient all-reduce."""
    z = torch.zeros(1, 2, dtype=torch.int64, device=device)
    return {
        "input_ids": z,
        "attention_mask": torch.tensor([[1, 0]], device=device),
        "position_ids": z,
        "labels": torch.full_like(z, IGNORE_INDEX),
    }


def _inputs(mb, device: torch.device) -> dict[str, torch.Tensor]:
    if mb.input_ids.numel() == 0:
        return _dummy_inputs(device)
    names = ("input_ids", "attention_mask", "position_ids", "labels")
    return {n: getattr(mb, n).to(device, non_blocking=True) for n in names}


def train_group(
    model: nn.Module,
    group: list,
    *,
    device: torch.device,
    world_size: int,
    bf16: bool = False,
) -> GroupStats:
    """Forward and backward over this rank's micro-batches of `group` (one per global step);
    gradients accumulate in `model`, normalised over every supervised token of the group on all
    ranks. The caller steps the optimizer."""
    n = len(group)
    local_tokens = torch.tensor([supervised_tokens(mb.labels) for mb in group], dtype=torch.float64)
    global_tokens = _all_reduce(local_tokens.to(device)).cpu()
    scale = ddp_loss_scale(int(global_tokens.sum()), world_size)
    sums = []
    for i, mb in enumerate(group):
        x = _inputs(mb, device)
        # Only the last micro-step of the group all-reduces gradients.
        sync = i == n - 1 or not isinstance(model, DistributedDataParallel)
        with contextlib.nullcontext() if sync else model.no_sync():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(x["input_ids"], x["attention_mask"], x["position_ids"])
            loss_sum, correct = token_sums(logits, x["labels"])
            (loss_sum * scale).backward()
        sums.append(torch.stack([loss_sum.detach().double(), correct.double()]))
    local = torch.zeros(n, 5, dtype=torch.float64, device=device)
    local[:, :2] = torch.stack(sums)
    local[:, 2] = torch.tensor([mb.num_real_tokens for mb in group], dtype=torch.float64)
    local[:, 3] = torch.tensor([mb.num_padded_tokens for mb in group], dtype=torch.float64)
    local[:, 4] = torch.tensor([len(mb.sample_ids) for mb in group], dtype=torch.float64)
    tot = _all_reduce(local).cpu().numpy()
    return GroupStats(
        steps=[int(mb.step) for mb in group],
        buckets=[int(mb.bucket) for mb in group],
        loss_sum=tot[:, 0],
        correct=tot[:, 1],
        tokens=global_tokens.numpy(),
        real=tot[:, 2],
        padded=tot[:, 3],
        samples=tot[:, 4],
        sample_ids=[np.asarray(mb.sample_ids) for mb in group],
    )


class _Window:
    """Sums over the steps since the last log line (named timers and token counts)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.wait_s = 0.0
        self.steps = 0
        self.real = 0.0
        self.padded = 0.0

    def add(self, stats: GroupStats, wait_s: float) -> None:
        self.wait_s += wait_s
        self.steps += len(stats.steps)
        self.real += float(stats.real.sum())
        self.padded += float(stats.padded.sum())

    def metrics(self) -> dict[str, float]:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        return {
            "data/padding_efficiency": self.real / max(self.padded, 1.0),
            "data/real_tokens_per_s": self.real / dt,
            "data/padded_tokens_per_s": self.padded / dt,
            "data/wait_fraction": self.wait_s / dt,
            "perf/step_s": dt / max(self.steps, 1),
        }


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


def _crossed(before: int, after: int, every: int | None) -> bool:
    return every is not None and after // every > before // every


def _fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _maybe_fail(steps_done: int, rank: int) -> None:
    at = os.environ.get(FAIL_AT_STEP_ENV)
    marker = os.environ.get(FAIL_MARKER_ENV)
    if at is None or marker is None or steps_done != int(at):
        return
    if os.environ.get(FAIL_RANK_ENV, str(rank)) != str(rank):
        return
    mark = Path(f"{marker}.rank{rank}")
    if mark.exists():
        return
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()
    raise RuntimeError(f"injected failure after global step {steps_done} ({FAIL_AT_STEP_ENV})")


class _SampleRecorder:
    """Appends (epoch, step, rank, bucket, sample ids) per micro-batch to <dir>/rank<r>.jsonl;
    each (re)start first writes a start event with the worker's pid (fault tests kill it)."""

    def __init__(self, directory: str | None, rank: int):
        self.path = Path(directory) / f"rank{rank}.jsonl" if directory else None
        self.rank = rank
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def start(self, epoch: int, step: int) -> None:
        self._write(
            {"event": "start", "epoch": epoch, "step": step, "rank": self.rank, "pid": os.getpid()}
        )

    def record(self, epoch: int, stats: GroupStats) -> None:
        for step, bucket, ids in zip(stats.steps, stats.buckets, stats.sample_ids, strict=True):
            self._write(
                {
                    "epoch": epoch,
                    "step": step,
                    "rank": self.rank,
                    "bucket": bucket,
                    "ids": ids.tolist(),
                }
            )

    def _write(self, obj: dict) -> None:
        if self.path:
            with self.path.open("a") as f:
                f.write(json.dumps(obj) + "\n")


def _seed_worker(seed: int, rank: int, steps_done: int) -> None:
    """Per-rank dropout RNG from a seed tuple (never seed + rank, which collides)."""
    s = int(np.random.SeedSequence((seed, rank, steps_done)).generate_state(1)[0])
    torch.manual_seed(s)


def train_loop(config: dict) -> None:
    """Ray Train's train_loop_per_worker. `config` is LoopInputs.to_dict()."""
    import ray.train
    import ray.train.torch

    from pipeline.data import rank_batches  # the Ray Data layer; imported on the worker

    inp = LoopInputs(**config)
    cfg = RunConfig.model_validate(inp.cfg)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    use_bf16 = cfg.train.bf16 == "on" or (cfg.train.bf16 == "auto" and device.type == "cuda")
    S = inp.steps_per_epoch
    length = run_length(S, cfg.train)
    total_steps = length.global_steps
    global_batch = global_batch_definition(cfg, inp.edges)

    # ---- model, optimizer, schedule (same init on every rank; DDP also broadcasts rank 0's)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, max_positions=inp.edges[-1]).to(device)
    optimizer = build_optimizer(model, cfg.train)
    scheduler = build_scheduler(optimizer, cfg.train, length.optimizer_steps)
    tracker = BucketLossTracker(len(inp.edges) - 1)
    position = DataPosition(0, 0, inp.epochs[0]["hash"], world, global_batch, 0)
    counters = {"updates": 0, "tokens": 0.0, "padded": 0.0, "samples": 0.0}
    run_id = new_run_id()

    # ---- resume (contract 7)
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = load_checkpoint(d, rank=rank)
        p = state.position
        if p.epoch < len(inp.epochs):
            check_resume(
                p,
                global_batch=global_batch,
                plan_hash=inp.epochs[p.epoch]["hash"],
                world_size=world,
                on_world_size_change=cfg.plan.on_world_size_change,
            )
        model.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        scheduler.load_state_dict(state.scheduler)
        tracker.load_state_dict(state.tracker)
        counters, run_id = dict(state.counters), state.wandb_run_id
        position = p.normalized(S)
        if state.rng is not None and p.world_size == world:
            set_rng_state(state.rng)
        else:
            _seed_worker(cfg.train.seed, rank, p.steps_done)
        if rank == 0:
            print(
                f"[bucketray] resuming at epoch {position.epoch} step {position.next_step} "
                f"({p.steps_done} global steps done, written by {p.world_size} workers)",
                flush=True,
            )
    else:
        _seed_worker(cfg.train.seed, rank, 0)

    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    logger: MetricLogger = make_logger(
        cfg, rank=rank, run_id=run_id, wandb_dir=inp.wandb_dir, metrics_file=cfg.train.metrics_file
    )
    recorder = _SampleRecorder(cfg.train.record_sample_ids, rank)
    recorder.start(position.epoch, position.next_step)

    steps_done = position.steps_done
    last_ckpt_step = steps_done if ckpt is not None else -1
    last_loss = float("nan")
    window = _Window()
    run_t0 = time.perf_counter()
    run_steps0 = steps_done

    def checkpoint(epoch: int, next_step: int) -> None:
        nonlocal last_ckpt_step
        t0 = time.perf_counter()
        pos = DataPosition(
            epoch, next_step, inp.epochs[epoch]["hash"], world, global_batch, steps_done
        )
        state = TrainState(
            model=model.state_dict(),
            optimizer=optimizer.state_dict(),
            scheduler=scheduler.state_dict(),
            position=pos,
            wandb_run_id=run_id,
            counters=counters,
            tracker=tracker.state_dict(),
            rng=rng_state(),
        )
        with tempfile.TemporaryDirectory(prefix="bucketray-ckpt-") as d:
            save_checkpoint(d, state, rank=rank)
            ray.train.report(
                {
                    "steps": steps_done,
                    "epoch": epoch,
                    "next_step": next_step,
                    "tokens": counters["tokens"],
                    "samples": counters["samples"],
                    "loss": last_loss,
                    "padding_efficiency": counters["tokens"] / max(counters["padded"], 1.0),
                },
                checkpoint=ray.train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"checkpoint_step{steps_done:08d}",
            )
        last_ckpt_step = steps_done
        logger.log({"checkpoint/save_s": time.perf_counter() - t0}, step=steps_done)

    # ---- run -> epoch -> step
    for epoch in range(position.epoch, cfg.train.epochs):
        if steps_done >= total_steps:
            break
        start = position.next_step if epoch == position.epoch else 0
        if start == 0:
            logger.log({"epoch/index": epoch, **inp.epochs[epoch]["metrics"]}, step=steps_done)
        batches = rank_batches(
            inp.feeder,
            epoch=epoch,
            start_step=start,
            rank=rank,
            world_size=world,
            pin_memory=device.type == "cuda",
        )
        epoch_done, last_step = False, start - 1
        while steps_done < total_steps:
            group, wait_s = _take(batches, min(cfg.train.grad_accum, total_steps - steps_done))
            if not group:
                break
            stats = train_group(ddp, group, device=device, world_size=world, bf16=use_bf16)
            grad_norm = torch.nn.utils.clip_grad_norm_(
                model.parameters(), cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf")
            )
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

            before, steps_done = steps_done, steps_done + len(group)
            counters["updates"] += 1
            counters["tokens"] += float(stats.real.sum())
            counters["padded"] += float(stats.padded.sum())
            counters["samples"] += float(stats.samples.sum())
            for i, b in enumerate(stats.buckets):
                debiased = tracker.update(b, stats.step_loss(i))
            last_loss = stats.step_loss(len(group) - 1)
            recorder.record(epoch, stats)
            window.add(stats, wait_s)

            if _crossed(before, steps_done, cfg.train.log_every) or steps_done == total_steps:
                i = len(group) - 1
                m = {
                    "train/loss": last_loss,
                    "train/accuracy": float(stats.correct[i] / max(stats.tokens[i], 1)),
                    "train/lr": lr,
                    "train/grad_norm": float(grad_norm),
                    "train/bucket": stats.buckets[i],
                    "train/loss_debiased": debiased,
                    "train/epoch": epoch,
                    **{
                        f"train/loss_by_bucket/{k}": float(v)
                        for k, v in enumerate(tracker.bucket_mean)
                        if not np.isnan(v)
                    },
                    **window.metrics(),
                }
                logger.log(m, step=steps_done)
                if rank == 0:
                    rate = (steps_done - run_steps0) / max(time.perf_counter() - run_t0, 1e-9)
                    print(
                        f"[bucketray] step {steps_done}/{total_steps} | epoch {epoch} "
                        f"{stats.steps[-1] + 1}/{S} ({100 * (stats.steps[-1] + 1) / S:.0f}%) | "
                        f"loss {last_loss:.4f} | {m['data/real_tokens_per_s'] / 1e3:.1f} Ktok/s | "
                        f"ETA {_fmt_eta((total_steps - steps_done) / rate if rate else math.inf)}",
                        flush=True,
                    )
                window.reset()

            last_step = stats.steps[-1]
            epoch_done = last_step == S - 1
            if (
                epoch_done
                or steps_done == total_steps
                or _crossed(before, steps_done, cfg.checkpoint.every_steps)
            ):
                checkpoint(epoch, last_step + 1)
            _maybe_fail(steps_done, rank)
            if epoch_done:
                break
        if not epoch_done and steps_done < total_steps:
            raise RuntimeError(
                f"the data layer ended epoch {epoch} on rank {rank} after step {last_step}, "
                f"but the plan has {S} steps"
            )
    logger.finish()
