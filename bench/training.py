"""Training throughput: the tiny model trained under each batching policy in one Ray session.

    python -m bench.training --out benchmarks/training.json [--quick]

Every policy trains the same samples (one epoch of one scaled corpus), the same model, under the
same per-step token budget, through the real `pipeline.train.launch.run`; only `plan.policy` and the
bucket edges differ. CPU workers cannot afford the preset's 8192-token samples, so the corpus
keeps the preset's length *distribution* scaled by max_length / 8192 (and the team's edges with
it), instead of truncating at max_length, which would pile most samples onto one length.
Throughput is read back from the rank-0 metrics file (one JSON line per step, `bench.runs`).
The script also measures loss readability (raw against bucket-debiased loss, step to step) on
those runs and on real text (`bench.realtext`) and the same policies under a token budget; it
draws training.png, loss.png and realtext_bucket_loss.png beside the JSON. GPU steps are
`bench.gpu`'s question.
"""

from __future__ import annotations

import json
import statistics
import uuid
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bench.common import run_script
from bench.plots import plot_bucket_curves, plot_loss, plot_training
from bench.quality import loss_readability
from bench.runs import (
    WARMUP_STEPS,
    load1,
    median_of,
    read_metric_lines,
    round_ratios,
    run_overrides,
    run_summary,
    timed_run,
)
from pipeline.core.config import TEAM_EDGES, load_config
from pipeline.core.epochs import resolve_edges
from pipeline.core.synthetic import MAX_LEN, seed902k_lengths, synthetic_tokens
from pipeline.data.corpus import token_table

__all__ = [
    "POLICIES",
    "scaled_lengths",
    "scaled_edges",
    "write_scaled_corpus",
    "policy_overrides",
    "aggregate_runs",
    "measure_training",
    "main",
]

POLICIES = ("sorted", "random", "edges:team", "optimal:auto")
# The team's table is fixed-size batches (their own measurements): at B=32 every policy runs the same number
# of steps with the same worst-case step (32 x max_length), so per-step overhead is shared and
# the ratios compare padding; `measure_training(batching=...)` also takes a token budget.
DEFAULT_BATCHING = {"mode": "fixed", "batch_size": 32}
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


def measure(args, log) -> dict:
    """Every policy's training, their readability, the token-budget round and real text."""
    import ray

    from bench.realtext import measure_realtext

    quick = args.quick
    samples, max_length = (600, 128) if quick else (args.samples, 512)
    repeats = 1 if quick else args.repeats
    work = Path(args.work)
    out = measure_training(
        work / "train", num_samples=samples, max_length=max_length, repeats=repeats, log=log
    )
    out["readability"] = {}
    for p in ("edges:team", "optimal:auto"):
        curves = out["policies"][p]["curves"]
        # The first steps come before every bucket has a running loss: leave a quarter out.
        out["readability"][p] = loss_readability(curves, skip=len(curves["loss"]) // 4)
    if not quick:
        budget = {"mode": "token_budget", "token_budget": 32 * max_length}
        tb = measure_training(
            work / "train", num_samples=samples, max_length=max_length, batching=budget,
            repeats=1, log=log,
        )  # fmt: skip
        for p in tb["policies"].values():
            p.pop("curves")
        out["token_budget"] = tb
    log("real text (the stdlib corpus): readability and per-bucket loss")
    out["realtext"] = measure_realtext(
        work / "realtext", max_length=max_length, max_steps=40 if quick else 300, log=log
    )
    ray.shutdown()
    plots = Path(args.plots)
    plot_training(out, plots / "training.png")
    plot_loss(out, ["edges:team", "optimal:auto"], plots / "loss.png")
    plot_bucket_curves(out["realtext"], plots / "realtext_bucket_loss.png")
    return {"training": out}


def main(argv: list[str] | None = None) -> dict:
    def add_args(p):
        p.add_argument("--samples", type=int, default=3000, help="training corpus size")
        p.add_argument("--repeats", type=int, default=3, help="rounds of every policy")
        p.add_argument("--work", default="out/bench", help="corpora, indexes and runs")

    return run_script("bench.training", __doc__, measure, add_args, argv)


if __name__ == "__main__":
    main()
