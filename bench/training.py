"""Benchmark section 2: the tiny model trained under each batching policy in one Ray session.

Every policy trains the same samples (one epoch of one scaled corpus), the same model, under the
same per-step token budget, through the real `pipeline.train.launch.run`; only `plan.policy` and the
bucket edges differ. CPU workers cannot afford the preset's 8192-token samples, so the corpus
keeps the preset's length *distribution* scaled by max_length / 8192 (and the team's edges with
it), instead of truncating at max_length, which would pile most samples onto one length.
Throughput is read back from the rank-0 metrics file (one JSON line per step).
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.core.config import TEAM_EDGES, load_config
from pipeline.core.epochs import resolve_edges
from pipeline.core.synthetic import MAX_LEN, seed902k_lengths, synthetic_tokens
from pipeline.data.corpus import token_table

__all__ = [
    "POLICIES",
    "load1",
    "median_of",
    "read_metric_lines",
    "round_ratios",
    "run_overrides",
    "timed_run",
    "scaled_lengths",
    "scaled_edges",
    "write_scaled_corpus",
    "policy_overrides",
    "run_summary",
    "aggregate_runs",
    "measure_training",
]

POLICIES = ("sorted", "random", "edges:team", "optimal:auto")
# The team's table is fixed-size batches (their own measurements): at B=32 every policy runs the same number
# of steps with the same worst-case step (32 x max_length), so per-step overhead is shared and
# the ratios compare padding; `measure_training(batching=...)` also takes a token budget.
DEFAULT_BATCHING = {"mode": "fixed", "batch_size": 32}
# Steps at the start of each run left out of throughput: the first forward/backward allocates
# and the plan puts the longest batch first (an out-of-memory shows at step 1).
WARMUP_STEPS = 2
_MARKER = "_bucketray_bench_corpus.json"  # "_": the shard listing skips it


def scaled_lengths(num_samples: int, max_length: int, seed: int = 0) -> np.ndarray:
    """The preset's lengths multiplied by max_length / 8192, rounded, at least 2 tokens (one
    supervised next-token target)."""
    raw = seed902k_lengths(num_samples, seed).astype(np.float64)
    return np.clip(np.round(raw * max_length / MAX_LEN), 2, max_length).astype(np.int32)


def scaled_edges(max_length: int, edges=TEAM_EDGES) -> list[int]:
    """Edges multiplied by max_length / 8192 and rounded: bucket k keeps the same samples."""
    out = [int(round(e * max_length / MAX_LEN)) for e in edges]
    return [0, *sorted(set(out[1:]))]


def write_scaled_corpus(
    out_dir: str | Path,
    *,
    num_samples: int,
    max_length: int,
    vocab_size: int,
    seed: int = 0,
) -> Path:
    """A 2-shard parquet corpus (sample_id, input_ids) of `scaled_lengths`; idempotent."""
    out = Path(out_dir)
    params = {
        "num_samples": num_samples,
        "max_length": max_length,
        "vocab": vocab_size,
        "seed": seed,
    }
    marker = out / _MARKER
    if marker.is_file() and json.loads(marker.read_text()) == params:
        return out
    out.mkdir(parents=True, exist_ok=True)
    for p in out.glob("shard-*.parquet"):
        p.unlink()
    lengths = scaled_lengths(num_samples, max_length, seed)
    half = num_samples // 2
    for s, (lo, hi) in enumerate([(0, half), (half, num_samples)]):
        ids = np.arange(lo, hi, dtype=np.int64)
        values, offsets = synthetic_tokens(lengths[lo:hi], ids, vocab_size=vocab_size, seed=seed)
        pq.write_table(token_table(ids, values, offsets), out / f"shard-{s:05d}.parquet")
    marker.write_text(json.dumps(params))
    return out


def policy_overrides(policy: str, max_length: int) -> list[str]:
    """The `--set` overrides that select a policy (the rest of the config is shared)."""
    if policy in ("sorted", "random"):
        # The baselines batch across all lengths: one bucket up to the top edge.
        return [f"plan.policy={policy}", f"buckets.edges=[0,{max_length}]"]
    if policy == "edges:team":
        return [f"buckets.edges={scaled_edges(max_length)}".replace(" ", "")]
    if policy == "optimal:auto":
        return ["buckets.num_buckets=auto"]
    raise ValueError(f"unknown policy {policy!r}: choose one of {POLICIES}")


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
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


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


def _shared_overrides(work: Path, corpus, max_length: int, batching: dict) -> list[str]:
    """The `--set` overrides every policy's run shares."""
    return [
        f"data.path={corpus}",
        f"data.cache_dir={work / 'index'}",
        f"data.max_length={max_length}",
        "data.over_length=error",
        # Rounding 1/16-scale lengths up to 8 would be like rounding full-scale ones up to 128.
        "batching.pad_to_multiple_of=1",
        *(f"batching.{k}={v}" for k, v in batching.items()),
        *run_overrides(work),
    ]


def _train_once(
    run,
    config: str,
    shared: list[str],
    policy: str,
    max_length: int,
    r: int,
    work: Path,
    lengths,
    edges: dict[str, list[int]],
    log,
) -> dict:
    """One policy's run in round `r`: its run summary plus round, wall time and load; records
    the policy's resolved edges in `edges` on its first run."""
    name = f"bench-{policy.replace(':', '-')}-{r}-{uuid.uuid4().hex[:6]}"
    mfile = work / "metrics" / f"{name}.jsonl"
    cfg = load_config(
        config,
        [
            *shared,
            *policy_overrides(policy, max_length),
            f"train.metrics_file={mfile}",
            f"checkpoint.run_name={name}",
        ],
    )
    if policy not in edges:
        edges[policy] = resolve_edges(cfg, lengths)
    load = load1()
    summary, wall = timed_run(run, cfg)
    s = run_summary(read_metric_lines(mfile))
    s |= {
        "round": r,
        "wall_s": wall,
        "samples": summary.samples,
        "tokens": summary.tokens,
    }
    s["load1"] = [load, load1()]  # 1-min load average before and after the run
    log(
        f"train {policy:<13} round {r}: {s['real_tokens_per_s'] / 1e3:7.1f} Ktok/s, "
        f"{s['steps']} steps, padding {s['padding_efficiency']:.3f}, wall {wall:.0f}s"
    )
    return s


def measure_training(
    work_dir: str | Path,
    *,
    num_samples: int = 3000,
    max_length: int = 512,
    batching: dict | None = None,
    repeats: int = 3,
    policies=POLICIES,
    config: str = "configs/local_full.yaml",
    log=print,
) -> dict:
    """Train one epoch per policy, `repeats` rounds (policies rotated within a round, so slow
    phases of a shared machine spread over all of them); medians per policy, and each round's
    ratio to that round's sorted run."""
    import ray

    from pipeline.train.launch import run

    batching = batching or dict(DEFAULT_BATCHING)
    work = Path(work_dir).absolute()
    base = load_config(config)
    corpus = write_scaled_corpus(
        work / "corpus",
        num_samples=num_samples,
        max_length=max_length,
        vocab_size=base.model.vocab_size,
    )
    shared = _shared_overrides(work, corpus, max_length, batching)
    lengths = scaled_lengths(num_samples, max_length)
    if not ray.is_initialized():
        # A private cluster: never attach to a cluster someone else started on this machine.
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False

    runs: dict[str, list[dict]] = {p: [] for p in policies}
    edges: dict[str, list[int]] = {}
    for r in range(repeats):
        order = list(policies[r % len(policies) :]) + list(policies[: r % len(policies)])
        for policy in order:
            s = _train_once(run, config, shared, policy, max_length, r, work, lengths, edges, log)
            runs[policy].append(s)
    return {
        "num_samples": num_samples,
        "max_length": max_length,
        "scale": max_length / MAX_LEN,
        "batching": batching,
        "team_edges_scaled": scaled_edges(max_length),
        "repeats": repeats,
        "warmup_steps_excluded": WARMUP_STEPS,
        "config": config,
        "model": base.model.model_dump(),
        "shared_overrides": [
            o for o in shared if not o.startswith(("data.path", "data.cache", "checkpoint.storage"))
        ],
        "policy_overrides": {p: policy_overrides(p, max_length) for p in policies},
        "policies": {p: aggregate_runs(runs[p], runs[policies[0]]) for p in policies},
        "edges": edges,
    }


def median_of(runs: list[dict], key: str) -> float:
    """The median of one figure over rounds."""
    return float(statistics.median(x[key] for x in runs))


def round_ratios(runs: list[dict], sorted_runs: list[dict], key: str) -> list[float]:
    """Each round's `key` over the sorted baseline's in the same round (rounds share the
    machine's load, so the ratio is taken before any median)."""
    return [x[key] / s[key] for x, s in zip(runs, sorted_runs, strict=True)]


def aggregate_runs(runs: list[dict], sorted_runs: list[dict]) -> dict:
    """Medians over repeats; the ratio to sorted is taken per round, then the median."""

    def med(key):
        return median_of(runs, key)

    ratios = round_ratios(runs, sorted_runs, "real_tokens_per_s")
    return {
        "real_tokens_per_s": med("real_tokens_per_s"),
        "real_tokens_per_s_all": [x["real_tokens_per_s"] for x in runs],
        "vs_sorted": float(statistics.median(ratios)),
        "vs_sorted_all": ratios,
        "steps_per_s": med("steps_per_s"),
        "wait_fraction": med("wait_fraction"),
        "padding_efficiency": med("padding_efficiency"),
        "planned_padding_efficiency": runs[0]["planned_padding_efficiency"],
        "steps": runs[0]["steps"],
        "samples": runs[0]["samples"],
        "tokens": runs[0]["tokens"],
        "num_buckets": runs[0]["num_buckets"],
        "wall_s": med("wall_s"),
        "load1_all": [x.get("load1") for x in runs],
        "curves": {k: runs[0][k] for k in ("loss", "loss_debiased", "bucket", "loss_by_bucket")},
    }
