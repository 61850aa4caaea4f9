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
2. The step kernel (`measure_step_kernel`): forward + backward of the same model on the same
   documents, single-threaded, padded (sorted batches, each padded to its longest) against
   packed rows with the grouped per-document attention and with the block-mask reference, the
   allocator set as in a training worker (`pipeline.data.rechunk.keep_freed_memory`).
3. The training plans' compute (`measure_plan_kernel`): forward + backward + the training loss,
   single-threaded, on the very micro-batches the training runs feed rank 0 (epoch 0 of each
   variant's plan over the same corpus, every second one), the variants taking turns micro-batch
   by micro-batch. It isolates what the batching changes, compute per real token, and its
   fine interleaving makes it precise where whole training runs on a shared machine spread by
   +-10% between rounds.
4. The on-paper table and the time to pack an epoch of the 902K preset (`bench.packing`).

    python -m bench.packed_training --out benchmarks/packed.json [--quick]
"""

from __future__ import annotations

import statistics
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bench.common import run_script
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
from bench.training import scaled_lengths
from pipeline.core.config import load_config

__all__ = [
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
# Packed rows hold this many longest samples: a sample that does not fit a row's rest opens a
# new row, so a row of one top edge leaves on average more of itself empty than a row of four
# (on the demo corpus, best-fit fills 0.985 of 512-token rows and 0.995 of 2048-token rows);
# attention stays within each document, so a longer row costs no more per token.
ROW_LENGTHS = 4
DEMO_CONFIG = "configs/local.yaml"


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
    budget = base.batching.token_budget
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


def _tiny_model(model_cfg, max_length: int):
    import torch

    from pipeline.learn.factory import build_model

    torch.manual_seed(0)
    return build_model(model_cfg, max_length)


@contextmanager
def _one_thread_model(model_cfg, max_length: int):
    """(the model, whether freed memory is kept) for timing compute as a training worker runs
    it: one torch thread, freed memory kept for reuse (`keep_freed_memory`, which a worker's data
    stream sets); the thread count is restored after."""
    import torch

    from pipeline.data.rechunk import keep_freed_memory

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reused = keep_freed_memory()
        yield _tiny_model(model_cfg, max_length), reused
    finally:
        torch.set_num_threads(threads)


def _collate(values, offsets, samples, per_row, T, multiple=1):
    """The samples (indices into offsets), packed into rows of `per_row` samples each, or (None)
    one padded row per sample."""
    from pipeline.core.collate import collate
    from pipeline.core.packed_collate import collate_packed

    v = np.concatenate([values[offsets[i] : offsets[i + 1]] for i in samples])
    o = np.concatenate([[0], np.cumsum(offsets[samples + 1] - offsets[samples])])
    if per_row is None:
        return collate(v, o, upper=T, pad_to_multiple_of=multiple)
    return collate_packed(v, o, np.concatenate([[0], np.cumsum(per_row)]), row_tokens=T)


def measure_step_kernel(
    *,
    config: str = DEMO_CONFIG,
    tokens: int = 16384,
    repeats: int = 5,
    seed: int = 0,
) -> dict:
    """Forward + backward of the config's model on the same ~`tokens` real tokens (lengths: the
    preset's distribution scaled to max_length), single-threaded; medians of `repeats` after one
    warm-up (module docstring, item 2)."""
    import torch
    import torch.nn.functional as F

    import pipeline.learn.model as model_module
    from pipeline.core.packing import best_fit_rows
    from pipeline.learn import packed_attention as pa

    cfg = load_config(config)
    T = cfg.data.max_length
    rng = np.random.default_rng(seed)
    pool = rng.permutation(scaled_lengths(max(4 * tokens // 64, 1000), T, seed))
    lens = pool[: int(np.searchsorted(np.cumsum(pool), tokens, side="right"))].astype(np.int64)
    real = int(lens.sum())
    values = rng.integers(3, cfg.model.vocab_size, real).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lens)])

    # Micro-batches of at most `slots` padded tokens each: packed, one row of R = ROW_LENGTHS
    # longest samples (as the training runs pack); padded, the samples sorted by length
    # (sorted-static), each batch as many as fit padded.
    R = ROW_LENGTHS * T
    slots = R
    row_of, closed = best_fit_rows(lens, R, 16)
    packed = []
    for rows in np.array_split(closed, -(-closed.size // (slots // R))):
        samples = [np.flatnonzero(row_of == r) for r in rows]
        packed.append(
            _collate(values, offsets, np.concatenate(samples), [len(x) for x in samples], R)
        )
    multiple = cfg.batching.pad_to_multiple_of
    padded, cur = [], []
    for i in np.argsort(lens, kind="stable"):
        width = -(-int(lens[i]) // multiple) * multiple
        if cur and (len(cur) + 1) * width > slots:
            padded.append(_collate(values, offsets, np.array(cur), None, T, multiple))
            cur = []
        cur.append(i)
    padded.append(_collate(values, offsets, np.array(cur), None, T, multiple))

    def tensors(b):
        return {k: torch.as_tensor(v) for k, v in b.items() if np.ndim(v) == 2}

    packed_t, padded_t = [tensors(b) for b in packed], [tensors(b) for b in padded]

    def step(batches):
        for b in batches:
            logits = model(b["input_ids"], b["attention_mask"], b["position_ids"])
            logits.float().logsumexp(-1).mean().backward()

    def mask_attention(qkv, docs, dropout_p=0.0):
        q, k, v = (x.transpose(1, 2) for x in qkv.unbind(2))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=pa.block_causal_mask(docs.doc))
        return out.transpose(1, 2)

    variants = {
        "padded": (lambda: step(padded_t), pa.document_attention_qkv),
        "packed": (lambda: step(packed_t), pa.document_attention_qkv),
        "packed_block_mask": (lambda: step(packed_t), mask_attention),
    }
    times: dict[str, list[float]] = {v: [] for v in variants}
    before = load1()
    with _one_thread_model(cfg.model, T) as (model, reused):
        try:
            for _ in range(repeats + 1):  # interleaved, so a slow phase hits every variant
                for name, (fn, attention) in variants.items():
                    model_module.document_attention_qkv = attention
                    t = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t)
        finally:
            model_module.document_attention_qkv = pa.document_attention_qkv
    med = {v: statistics.median(ts[1:]) for v, ts in times.items()}
    return {
        "config": config,
        "documents": int(lens.size),
        "real_tokens": real,
        "max_length": T,
        "row_tokens": R,
        "micro_batch_slots": slots,
        "packed_rows": int(closed.size),
        "packed_slots": int(closed.size) * R,
        "padded_batches": len(padded),
        "padded_slots": int(sum(b["input_ids"].size for b in padded)),
        "repeats": repeats,
        "seconds": med,
        "seconds_all": times,
        "real_tokens_per_s": {v: real / s for v, s in med.items()},
        "packed_vs_padded": med["padded"] / med["packed"],
        "block_mask_vs_padded": med["padded"] / med["packed_block_mask"],
        "load1": [before, load1()],
        "keep_freed_memory": reused,
    }


def _plan_micro_batches(cfg, lengths, sample_ids, *, rank: int, every: int, rng) -> dict:
    """Every `every`-th non-empty micro-batch of `rank` in epoch 0 of `cfg`'s plan over these
    lengths, collated as the data stream collates it (`pipeline.data.rechunk.collate_micro_batch`),
    with random token ids of the same lengths."""
    import types

    import torch

    from pipeline.core.epochs import epoch_plan_for, resolve_edges
    from pipeline.data.rechunk import TENSOR_KEYS, collate_micro_batch

    edges = resolve_edges(cfg, lengths)
    index = types.SimpleNamespace(lengths=lengths, sample_ids=sample_ids)
    plan = epoch_plan_for(cfg, index, edges, 0, cfg.scaling.num_workers)
    view = plan.rank_view(rank)
    o = view.offsets
    nonempty = np.flatnonzero(np.diff(o) > 0)
    batches, reals, slots = [], [], 0
    for m in nonempty[::every]:
        a, b = int(o[m]), int(o[m + 1])
        lens = view.lengths[a:b].astype(np.int64)
        vals = rng.integers(3, cfg.model.vocab_size, int(lens.sum())).astype(np.int32)
        out = collate_micro_batch(
            view, m, vals, lens, pad_to_multiple_of=cfg.batching.pad_to_multiple_of
        )
        batches.append({k: torch.from_numpy(out[k]) for k in TENSOR_KEYS})
        reals.append(int(lens.sum()))
        slots += int(out["input_ids"].size)
    return {
        "batches": batches,
        "real": reals,
        "steps": plan.num_steps,
        "micro_batches": len(batches),
        "real_tokens": sum(reals),
        "slots": slots,
        "num_buckets": len(edges) - 1,
    }


def measure_plan_kernel(
    lengths: np.ndarray,
    sample_ids: np.ndarray,
    configs: dict,
    *,
    every: int = 4,
    blocks: int = 4,
    rank: int = 0,
    seed: int = 0,
) -> dict:
    """Forward + backward + the training loss of one model, single-threaded, on the micro-batches
    the training runs feed rank `rank` in epoch 0 of each config's plan (`configs`: variant ->
    RunConfig) over the same corpus lengths: every `every`-th micro-batch, so a sorted epoch's
    short and long steps are both in. The variants take turns micro-batch by micro-batch, so a
    slow phase of a shared machine falls on every variant alike. The spread: `blocks` strided
    subsets (block b of a variant: its micro-batches b, b + blocks, ...) each give their own
    ratio to sorted-static.
    This is the compute the batching changes, without Ray, the other rank, the optimizer or
    the data stream: a precise ratio where a whole training run's is noisy."""
    from pipeline.learn.loss import token_sums

    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int64)
    made = {
        v: _plan_micro_batches(c, lengths, sample_ids, rank=rank, every=every, rng=rng)
        for v, c in configs.items()
    }
    first = next(iter(configs.values()))

    def train_on(batches) -> float:
        t = time.perf_counter()
        for b in batches:
            logits = model(b["input_ids"], b["attention_mask"], b["position_ids"])
            loss, _ = token_sums(logits, b["labels"])
            loss.backward()
            model.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    names = list(made)
    # Each micro-batch timed on its own, the variants' micro-batches interleaved in proportion
    # (each advances through its epoch at the same pace), so a slow second of a shared machine
    # falls on every variant alike.
    turns = sorted(
        ((i + 0.5) / len(made[v]["batches"]), k, v, i)
        for k, v in enumerate(names)
        for i in range(len(made[v]["batches"]))
    )
    secs = {v: np.zeros(len(made[v]["batches"])) for v in names}
    before = load1()
    with _one_thread_model(first.model, first.data.max_length) as (model, reused):
        for v in names:  # warm-up: one micro-batch each
            train_on(made[v]["batches"][:1])
        for _, _, v, i in turns:
            secs[v][i] = train_on(made[v]["batches"][i : i + 1])
    secs = {v: [float(x[b::blocks].sum()) for b in range(blocks)] for v, x in secs.items()}
    toks = {v: [sum(made[v]["real"][b::blocks]) for b in range(blocks)] for v in names}
    ref = "sorted" if "sorted" in names else names[0]
    out = {}

    def rates(v):
        return [t / s if s > 0 else float("nan") for t, s in zip(toks[v], secs[v], strict=True)]

    for v in names:
        ratios = [a / r for a, r in zip(rates(v), rates(ref), strict=True)]
        m = made[v]
        out[v] = {
            **{k: m[k] for k in ("steps", "micro_batches", "real_tokens", "slots", "num_buckets")},
            "token_efficiency": m["real_tokens"] / max(m["slots"], 1),
            "seconds": sum(secs[v]),
            "real_tokens_per_s": m["real_tokens"] / max(sum(secs[v]), 1e-9),
            "vs_sorted_blocks": [x for x in ratios if np.isfinite(x)],
        }
    for v in names:
        out[v]["vs_sorted"] = out[v]["real_tokens_per_s"] / out[ref]["real_tokens_per_s"]
    return {
        "samples": int(lengths.size),
        "rank": rank,
        "world_size": first.scaling.num_workers,
        "every": every,
        "blocks": blocks,
        "variants": out,
        "load1": [before, load1()],
        "keep_freed_memory": reused,
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
