"""A benchmark's training run: its shared overrides, its wall time, and its figures read back from
the rank-0 metrics file (`train.metrics_file`, one JSON line per step with `train.log_every=1`)."""

from __future__ import annotations

import json
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

from bench.common import loadavg

__all__ = [
    "WARMUP_STEPS",
    "load1",
    "median_of",
    "read_metric_lines",
    "round_ratios",
    "run_overrides",
    "run_summary",
    "timed_run",
]

# Steps at the start of each run left out of throughput: the first forward/backward allocates
# and the plan puts the longest batch first (an out-of-memory shows at step 1).
WARMUP_STEPS = 2


def run_summary(records: list[dict], warmup: int = WARMUP_STEPS) -> dict:
    """Throughput of one run from its per-step metric lines (train.log_every=1).

    A line's window covers one global step, so its real tokens are real_tokens_per_s x step_s;
    rates are totals over the steps after `warmup`, not means of per-step rates.
    """
    steps = sorted((r for r in records if "perf/step_s" in r), key=lambda r: r["step"])
    timed = steps[warmup:] or steps
    dt = np.array([r["perf/step_s"] for r in timed])
    real = np.array([r["data/real_tokens_per_s"] for r in timed]) * dt
    padded = np.array([r["data/padded_tokens_per_s"] for r in timed]) * dt
    wait = np.array([r["data/wait_fraction"] for r in timed]) * dt
    epoch = next((r for r in records if "epoch/steps" in r), {})
    return {
        "steps": len(steps),
        "timed_steps": len(timed),
        "real_tokens_per_s": float(real.sum() / dt.sum()),
        "padded_tokens_per_s": float(padded.sum() / dt.sum()),
        "steps_per_s": float(len(timed) / dt.sum()),
        "wait_fraction": float(wait.sum() / dt.sum()),
        "padding_efficiency": float(real.sum() / padded.sum()),
        "planned_padding_efficiency": epoch.get("epoch/planned_padding_efficiency"),
        "num_buckets": sum(1 for k in epoch if k.startswith("epoch/steps_per_bucket/")),
        "loss": [(r["step"], r["train/loss"]) for r in steps],
        "loss_debiased": [(r["step"], r["train/loss_debiased"]) for r in steps],
        "bucket": [r["train/bucket"] for r in steps],
        "loss_by_bucket": {
            k.rsplit("/", 1)[1]: [(r["step"], r[k]) for r in steps if k in r]
            for k in sorted({k for r in steps for k in r if k.startswith("train/loss_by_bucket/")})
        },
    }


def load1() -> float | None:
    """The 1-minute load average (the machine is shared: reported beside every figure)."""
    return next(iter(loadavg()), None)


def read_metric_lines(path: Path) -> list[dict]:
    """A run's metric lines (`train.metrics_file`), one dict per line."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def run_overrides(work: Path, *, max_steps: int | None = None) -> list[str]:
    """The `--set` overrides of a benchmark run: one epoch (or `max_steps`), a metric line per
    step, no W&B, checkpoints under `work`/runs kept only at the end."""
    return [
        "train.epochs=1",
        f"train.max_steps={'null' if max_steps is None else max_steps}",
        "train.log_every=1",
        "wandb.mode=disabled",
        f"checkpoint.storage_path={work / 'runs'}",
        "checkpoint.every_steps=null",
        "checkpoint.keep_last=1",
    ]


def timed_run(run, cfg):
    """(the run's summary, its wall seconds). The benchmarks' shared settings include knobs
    some variants do not use; their "has no effect" warnings are intended here."""
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".* has no effect")
        summary = run(cfg)
    return summary, time.perf_counter() - t


def median_of(runs: list[dict], key: str) -> float:
    """The median of one figure over rounds."""
    return float(statistics.median(x[key] for x in runs))


def round_ratios(runs: list[dict], sorted_runs: list[dict], key: str) -> list[float]:
    """Each round's `key` over the sorted baseline's in the same round (rounds share the
    machine's load, so the ratio is taken before any median)."""
    return [x[key] / s[key] for x, s in zip(runs, sorted_runs, strict=True)]
