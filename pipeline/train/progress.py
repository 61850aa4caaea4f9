"""What a training run reports besides checkpoints: step metrics, the console line, sample ids."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from pipeline.core.length_ranges import range_label
from pipeline.train.step import GroupStats

__all__ = [
    "Window",
    "step_metrics",
    "packed_step_metrics",
    "range_metrics",
    "progress_line",
    "fmt_eta",
    "SampleRecorder",
]


class Window:
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


def step_metrics(
    stats: GroupStats, *, lr: float, grad_norm: float, debiased: float, epoch: int
) -> dict[str, float]:
    """The `train/*` metrics of a logged optimizer step. `train/loss_by_bucket/<k>` is logged only
    for the buckets this step trained, with their real loss, so each bucket's curve in W&B is
    drawn from its own points."""
    i = len(stats.steps) - 1
    return {
        "train/loss": stats.step_loss(i),
        "train/accuracy": float(stats.correct[i] / max(stats.tokens[i], 1)),
        "train/lr": lr,
        "train/grad_norm": grad_norm,
        "train/bucket": stats.buckets[i],
        "train/loss_debiased": debiased,
        "train/epoch": epoch,
        **{f"train/loss_by_bucket/{k}": v for k, v in stats.bucket_losses().items()},
    }


def range_metrics(stats: GroupStats, ranges: list[int]) -> dict[str, float]:
    """`train/loss_by_length/<lo>-<hi>` of a logged step: the token-mean loss of the step's
    documents of each length range (all ranks); NaN for a range the step has no token of."""
    if not ranges or stats.range_loss.size == 0:
        return {}
    loss, tokens = stats.range_loss[-1], stats.range_tokens[-1]
    return {
        f"train/loss_by_length/{range_label(ranges, r)}": (
            float(loss[r] / tokens[r]) if tokens[r] > 0 else float("nan")
        )
        for r in range(len(ranges) - 1)
    }


def packed_step_metrics(stats: GroupStats, row_tokens: int) -> dict[str, float]:
    """The `data/*` metrics of a logged packed step (batching.mode=packed), over all ranks: rows
    trained, documents per row and row fill (real tokens over the rows' slots). The ranks' balance
    is planned, not measured: `epoch/rank_max_over_mean` (pipeline.core.epochs)."""
    i = len(stats.steps) - 1
    rows = float(stats.padded[i]) / row_tokens
    return {
        "data/rows": rows,
        "data/docs_per_row": float(stats.samples[i]) / max(rows, 1.0),
        "data/row_fill": float(stats.real[i]) / max(float(stats.padded[i]), 1.0),
    }


def fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def progress_line(
    *,
    steps_done: int,
    total_steps: int,
    epoch: int,
    epoch_step: int,
    steps_per_epoch: int,
    loss: float,
    tokens_per_s: float,
    rate: float,
) -> str:
    """Rank 0's console line; `epoch_step` counts the epoch's steps done, `rate` steps/s."""
    eta = fmt_eta((total_steps - steps_done) / rate if rate else math.inf)
    return (
        f"[bucketray] step {steps_done}/{total_steps} | epoch {epoch} "
        f"{epoch_step}/{steps_per_epoch} ({100 * epoch_step / steps_per_epoch:.0f}%) | "
        f"loss {loss:.4f} | {tokens_per_s / 1e3:.1f} Ktok/s | ETA {eta}"
    )


class SampleRecorder:
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
