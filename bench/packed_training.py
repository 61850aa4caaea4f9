"""Packed rows against padding, measured: CPU training in one run, the step kernel, the paper table.

Four measurements, all in one process on one machine, so their ratios compare like with like:

1. Same-run training (`measure_packed_training`): the demo's config (`configs/local.yaml`: the
   tiny decoder on real text, the stdlib corpus, 2 CPU workers) trains one whole epoch of the
   same samples three times through the real `pipeline.train.launch.run`, changing only the
   batching: `packed` (one bucket, a full shuffle, rows of `row_tokens`, as many rows per step as
   fill the config's token budget), `sorted` (sorted-static padding: one bucket up to
   max_length, `plan.policy=sorted`) and `auto` (bucketed padding on the optimiser's automatic
   edges). Whole epochs, because a sorted epoch's steps change with the length they hold.
   Throughput: the median over steps (after `WARMUP_STEPS`) of each step's real tokens per
   second, from the rank-0 metrics file. Loss readability: the variance of the step-to-step
   change of the raw loss (packed, bucketed) and of the debiased loss (bucketed), over the
   last three quarters of each run (`quality.loss_readability`). Rounds rotate the order.
2. The step kernel (`bench.kernels.measure_step_kernel`): forward + backward of the same model on the same
   documents, single-threaded, padded (sorted batches, each padded to its longest) against
   packed rows with the grouped per-document attention and with the block-mask reference, the
   allocator set as in a training worker (`pipeline.data.rechunk.keep_freed_memory`).
3. The training plans' compute (`bench.kernels.measure_plan_kernel`): forward + backward + the training loss,
   single-threaded, on the very micro-batches the training runs feed rank 0 (epoch 0 of each
   variant's plan over the same corpus, every second one), the variants taking turns micro-batch
   by micro-batch. It isolates what the batching changes, compute per real token, and its
   fine interleaving makes it precise where whole training runs on a shared machine spread by
   +-10% between rounds.
4. The on-paper table and the time to pack an epoch of the 902K preset (`bench.packing`).

    python -m bench.packed_training --out benchmarks/packed_training.json [--quick]
"""

from __future__ import annotations

import statistics
import uuid
from pathlib import Path

from bench.common import run_script
from bench.kernels import DEMO_CONFIG, ROW_LENGTHS, measure_plan_kernel, measure_step_kernel
from bench.packing import packing_table
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
from pipeline.core.config import load_config

__all__ = [
    "DEMO_CONFIG",
    "ROW_LENGTHS",
    "VARIANTS",
    "aggregate_variant",
    "main",
    "measure_packed_training",
    "measure_plan_compute",
    "measure_plan_kernel",
    "measure_step_kernel",
    "run_figures",
    "shared_overrides",
    "step_medians",
    "variant_overrides",
]

VARIANTS = ("packed", "sorted", "auto")


def variant_overrides(variant: str, *, max_length: int, token_budget: int, row_tokens: int):
    """The `--set` overrides that select a batching variant; the rest of the config is shared.
    Packed rows per step fill the same token budget the padded variants pay per step."""
    if variant == "packed":
        return [
            "batching.mode=packed",
            f"batching.row_tokens={row_tokens}",
            f"batching.rows_per_step={token_budget // row_tokens}",
            "buckets.num_buckets=auto",  # packed: one bucket, a full shuffle
        ]
    padded = ["batching.mode=token_budget", f"batching.token_budget={token_budget}"]
    if variant == "sorted":
        return [*padded, "plan.policy=sorted", f"buckets.edges=[0,{max_length}]"]
    if variant == "auto":
        return [*padded, "buckets.num_buckets=auto"]
    raise ValueError(f"unknown variant {variant!r}: choose one of {VARIANTS}")


def step_medians(records: list[dict], warmup: int = WARMUP_STEPS) -> dict:
    """Medians over the steps after `warmup` of per-step real tokens/s and step seconds."""
    steps = sorted((r for r in records if "perf/step_s" in r), key=lambda r: r["step"])
    timed = steps[warmup:] or steps
    return {
        "median_real_tokens_per_s": float(
            statistics.median(r["data/real_tokens_per_s"] for r in timed)
        ),
        "median_step_s": float(statistics.median(r["perf/step_s"] for r in timed)),
    }


def run_figures(records: list[dict]) -> dict:
    """One run's figures from its rank-0 metric lines (`train.log_every=1`): throughput
    (`training.run_summary` and the per-step medians) and loss readability over the last three
    quarters of the steps."""
    s = run_summary(records)
    curves = {k: s.pop(k) for k in ("loss", "loss_debiased", "bucket")}
    s.pop("loss_by_bucket")
    n = len(curves["loss"])
    return {**s, **step_medians(records), "readability": loss_readability(curves, skip=n // 4)}


def aggregate_variant(runs: list[dict], sorted_runs: list[dict]) -> dict:
    """Medians over rounds; the ratio to sorted-static is taken within each round first."""

    def med(key):
        return median_of(runs, key)

    ratios = round_ratios(runs, sorted_runs, "median_real_tokens_per_s")
    first = runs[0]
    return {
        "median_real_tokens_per_s": med("median_real_tokens_per_s"),
        "real_tokens_per_s": med("real_tokens_per_s"),
        "vs_sorted": float(statistics.median(ratios)),
        "vs_sorted_all": ratios,
        "diff_var_raw": float(statistics.median(x["readability"]["diff_var_raw"] for x in runs)),
        "diff_var_debiased": float(
            statistics.median(x["readability"]["diff_var_debiased"] for x in runs)
        ),
        "wall_s": med("wall_s"),
        **{k: first[k] for k in ("steps", "samples", "tokens", "padding_efficiency")},
        **{k: first[k] for k in ("num_buckets", "final_loss")},
        "load1_all": [x["load1"] for x in runs],
        "runs": runs,
    }


def shared_overrides(work: Path, num_samples: int) -> list[str]:
    """What every variant of the same-run training shares: the corpus, its index, the runs."""
    return [
        f"data.synthetic.num_samples={num_samples}",
        f"data.synthetic.out_dir={work / f'pystdlib-{num_samples}'}",
        f"data.cache_dir={work / 'index'}",
        *run_overrides(work),
    ]


def _train(run, config: str, overrides: list[str], work: Path, name: str) -> dict:
    mfile = work / "metrics" / f"{name}.jsonl"
    cfg = load_config(
        config, [*overrides, f"train.metrics_file={mfile}", f"checkpoint.run_name={name}"]
    )
    before = load1()
    summary, wall = timed_run(run, cfg)
    return run_figures(read_metric_lines(mfile)) | {
        "wall_s": wall,
        "samples": summary.samples,
        "tokens": summary.tokens,
        "final_loss": summary.loss,
        "load1": [before, load1()],
        "metrics_file": str(mfile),
    }


def measure_packed_training(
    work_dir: str | Path,
    *,
    num_samples: int = 6000,
    row_tokens: int | None = None,
    repeats: int = 1,
    config: str = DEMO_CONFIG,
    variants=VARIANTS,
    log=print,
) -> dict:
    """One epoch per variant per round (module docstring, item 1); starts a private local Ray
    if none is up. `row_tokens` defaults to `ROW_LENGTHS` times the config's max_length."""
    import ray

    from pipeline.train.launch import run

    work = Path(work_dir).absolute()
    base = load_config(config)
    max_length = base.data.max_length
    budget = base.batching.step_tokens  # the padded variants pay what the config's step holds
    row_tokens = row_tokens or ROW_LENGTHS * max_length
    shared = shared_overrides(work, num_samples)
    per = {
        v: variant_overrides(v, max_length=max_length, token_budget=budget, row_tokens=row_tokens)
        for v in variants
    }
    if not ray.is_initialized():
        # A private cluster: never attach to a cluster someone else started on this machine.
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(repeats):
        order = list(variants[r % len(variants) :]) + list(variants[: r % len(variants)])
        for v in order:
            name = f"packedbench-{v}-{r}-{uuid.uuid4().hex[:6]}"
            s = _train(run, config, [*shared, *per[v]], work, name)
            s["round"] = r
            runs[v].append(s)
            log(
                f"packed bench {v:<7} round {r}: median {s['median_real_tokens_per_s'] / 1e3:.1f} "
                f"Ktok/s, {s['steps']} steps, fill {s['padding_efficiency']:.3f}, "
                f"wall {s['wall_s']:.0f}s, load {s['load1']}"
            )
    ref = "sorted" if "sorted" in variants else variants[0]
    return {
        "config": config,
        "num_samples": num_samples,
        "max_length": max_length,
        "token_budget": budget,
        "row_tokens": row_tokens,
        "repeats": repeats,
        "warmup_steps_excluded": WARMUP_STEPS,
        "overrides": per,
        "model": base.model.model_dump(),
        "variants": {v: aggregate_variant(runs[v], runs[ref]) for v in variants},
    }


def measure_plan_compute(work_dir: str | Path, training: dict, *, every: int = 2) -> dict:
    """`measure_plan_kernel` on the corpus and the variants (their `overrides`) of a
    `measure_packed_training` result on the same `work_dir`, whose index it reads."""
    from pipeline.data.driver import find_run_data

    shared = shared_overrides(Path(work_dir).absolute(), training["num_samples"])
    configs = {
        v: load_config(training["config"], [*shared, *per])
        for v, per in training["overrides"].items()
    }
    index = find_run_data(next(iter(configs.values()))).index
    return {"config": training["config"]} | measure_plan_kernel(
        index.lengths, index.sample_ids, configs, every=every
    )


def measure(args, log) -> dict:
    """Every measurement of the module docstring (`--quick`: a smoke scale)."""
    from pipeline.core.synthetic import PRESETS, seed902k_lengths

    quick = args.quick
    log("the on-paper table and the time to pack an epoch")
    n = args.preset_samples or (50_000 if quick else PRESETS["seed902k"])
    out = {"paper": packing_table(seed902k_lengths(n))}
    log(f"packing {n:,} samples took {out['paper']['pack_epoch_s']:.2f} s")
    log("forward + backward, padded against packed")
    out["kernel"] = measure_step_kernel(tokens=4096 if quick else 16384)
    log(f"step kernel packed / padded {out['kernel']['packed_vs_padded']:.2f}x")
    log("same-run training")
    out["training"] = measure_packed_training(
        args.work,
        num_samples=600 if quick else args.num_samples,
        repeats=1 if quick else args.repeats,
        log=log,
    )
    log("the training plans' compute, variants interleaved")
    out["plan_kernel"] = measure_plan_compute(args.work, out["training"], every=8 if quick else 2)
    pk = out["plan_kernel"]["variants"]["packed"]["vs_sorted"]
    log(f"training plans' compute, packed / sorted-static {pk:.3f}x")
    return {"packed": out}


def main(argv: list[str] | None = None) -> dict:
    def add_args(p):
        p.add_argument("--work", default="out/bench-packed", help="corpus, index, runs")
        p.add_argument("--num-samples", type=int, default=6000, help="training corpus size")
        p.add_argument("--repeats", type=int, default=3, help="training rounds")
        p.add_argument("--preset-samples", type=int, help="paper table on this many (902,087)")

    return run_script("bench.packed_training", __doc__, measure, add_args, argv)


if __name__ == "__main__":
    main()
