"""The outcome: does a batching policy train a better model per hour? Held-out loss on real text.

The corpus: this Python's standard library split into definitions (`pystdlib`, byte tokens, cut
at the demo's 512), 7% of the source FILES held out (no held-out definition repeats a training
one); the model, optimiser and budget are the demo's. Two questions, answered apart:

1. At equal optimisation: `batching.mode=fixed` (the same samples per step, the same number of
   steps and the same schedule for every policy; packed rows take the rows per step that hold
   as many real tokens), so only the composition of the batches differs. The held-out loss
   after `epochs` epochs, mean and spread over seeds.
2. At equal time: the same runs, priced by what their steps cost. Each policy's seconds per
   real token are measured in one run on this machine: full training steps (forward, backward,
   clipping, AdamW) of every policy's own epoch-0 micro-batches, the policies taking turns step
   by step, the median of the per-round ratios to sorted-static. A policy's held-out curve
   against real tokens times its rate is its curve against time; read at the time sorted-static
   takes for `epochs` epochs (linear between evaluations), and the time at which it first
   reaches sorted-static's final held-out loss. A policy slower than sorted-static is read
   before its schedule ends; a faster one stops at its last epoch, before the budget.

Training runs in one process through the real planner, collation and `Trainer` (no Ray, one
rank): the loss curves are a deterministic function of the seed, whatever the machine's load.
The held-out loss is evaluated every `eval_every` global steps: every held-out sample once,
token-weighted, fp32 (`pipeline.core.evaluation`). Results go to a JSON file, written after
every run, so an interrupted benchmark continues where it stopped; the plot goes beside it
(`outcome.png`), the tables into BENCHMARKS.md with `make bench-render` (`bench.outcome_blocks`).

    python -m bench.outcome --out benchmarks/outcome.json [--seeds 0,1,2] [--epochs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import DEMO_CONFIG, torch_threads, write_json
from bench.outcome_policies import LABELS, POLICIES, ROW_GROUP_ROWS
from bench.plots import plot_outcome
from bench.training import scaled_edges
from pipeline.core.config import RunConfig, load_config
from pipeline.core.epochs import epoch_plan_for, resolve_edges
from pipeline.data.evalset import EvalSet, rank_eval_batches
from pipeline.data.textcorpus import write_text_corpus

__all__ = [
    "POLICIES",
    "Corpus",
    "load_corpus",
    "main",
    "policy_config",
    "speed_vs_sorted",
    "summarize",
]

HELDOUT = 0.07


@dataclass(frozen=True, eq=False)
class Corpus:
    """The training rows (ids ascending, cut at the top edge) and the held-out set."""

    sample_ids: np.ndarray
    lengths: np.ndarray
    table: pa.Table  # sample_id, input_ids: one row per sample, in sample_ids order
    held_out: EvalSet
    top: int
    summary: dict


def _read_split(root: Path, split: str, top: int) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    t = pa.concat_tables(pq.read_table(p) for p in sorted(root.glob(f"{split}-*.parquet")))
    t = t.take(pa.array(np.argsort(t["sample_id"].to_numpy(), kind="stable")))
    col = t["input_ids"].combine_chunks()
    offsets = col.offsets.to_numpy().astype(np.int64)
    values = col.values.to_numpy()
    lens = np.minimum(np.diff(offsets), top)  # data.over_length=truncate
    keep = np.concatenate([[0], np.cumsum(lens)])
    idx = np.repeat(offsets[:-1] - keep[:-1], lens) + np.arange(int(keep[-1]))
    ids = t["sample_id"].to_numpy().astype(np.int64)
    table = pa.table(
        {
            "sample_id": pa.array(ids),
            "input_ids": pa.LargeListArray.from_arrays(
                pa.array(keep), pa.array(values[idx].astype(np.int32))
            ),
        }
    )
    return ids, lens.astype(np.int64), table


def load_corpus(work: Path, num_samples: int, top: int) -> Corpus:
    """The stdlib corpus with held-out source files, written under `work` on first use."""
    root = work / "corpus"
    summary = write_text_corpus(
        root, max_samples=num_samples, heldout=HELDOUT, seed=0, progress=False
    )
    ids, lens, table = _read_split(root, "train", top)
    hids, hlens, htable = _read_split(root, "validation", top)
    held = EvalSet(str(root), hids, hlens, htable, supervision="")
    keep = ("samples", "train_samples", "heldout_samples", "heldout_duplicates_dropped", "python")
    return Corpus(ids, lens, table, held, top, {k: summary.get(k) for k in keep})


def policy_config(
    name: str, *, corpus: Corpus, seed: int, epochs: int, eval_every: int, batch_size: int
) -> RunConfig:
    """The demo config with the policy's overrides: `batch_size` samples per step (packed rows:
    8 rows of 2,048 tokens, about as many real tokens), `epochs` epochs, the held-out loss every
    `eval_every` steps."""
    top = corpus.top
    tokens = int(corpus.lengths.sum())
    fill = {
        "top": top,
        "team": str(scaled_edges(top)).replace(" ", ""),
        "w4": tokens // 4 + 1,
        "w16": tokens // 16 + 1,
    }
    per = [o.format(**fill) for o in POLICIES[name]]
    shared = [
        f"data.path={corpus.held_out.path}",  # not read: the rows are in memory
        "data.split=train",
        f"data.max_length={top}",
        f"train.epochs={epochs}",
        f"train.seed={seed}",
        f"plan.seed={seed}",
        "train.log_every=1000000",
        "wandb.mode=disabled",
        "checkpoint.every_steps=null",
        "scaling.num_workers=1",
        "eval.split=validation",
        f"eval.every_steps={eval_every}",
    ]
    if "batching.mode=packed" not in POLICIES[name]:
        shared += ["batching.mode=fixed", f"batching.batch_size={batch_size}"]
    return load_config(DEMO_CONFIG, shared + per)


def corpus_index(corpus: Corpus) -> SimpleNamespace:
    """The length index the plans see: one file of row groups of `ROW_GROUP_ROWS` samples."""
    n = corpus.lengths.size
    return SimpleNamespace(
        lengths=corpus.lengths,
        sample_ids=corpus.sample_ids,
        file_idx=np.zeros(n, dtype=np.int64),
        rows=np.arange(n, dtype=np.int64),
        row_groups=([min(ROW_GROUP_ROWS, n - a) for a in range(0, n, ROW_GROUP_ROWS)],),
    )


def _plans(cfg: RunConfig, corpus: Corpus, edges):
    index = corpus_index(corpus)
    return [epoch_plan_for(cfg, index, edges, e, 1) for e in range(cfg.train.epochs)]


def _batches(cfg: RunConfig, corpus: Corpus, plans):
    from pipeline.data.rechunk import deliver

    def batches(epoch: int, start: int):
        view = plans[epoch].slice(start).rank_view(0)
        rows = np.searchsorted(corpus.sample_ids, view.sample_ids)
        part = corpus.table.take(pa.array(rows, pa.int64()))
        return deliver(
            view, [part], epoch=epoch, pad_to_multiple_of=cfg.batching.pad_to_multiple_of
        )

    return batches


def train_run(cfg: RunConfig, corpus: Corpus) -> dict:
    """One training run in this process; its step history and held-out evaluations."""
    import torch

    from pipeline.learn.logger import NullLogger
    from pipeline.train.trainer import RunSpec, Trainer

    edges = [int(e) for e in resolve_edges(cfg, corpus.lengths)]
    plans = _plans(cfg, corpus, edges)
    with tempfile.TemporaryDirectory(prefix="bucketray-outcome-") as d:
        spec = RunSpec(
            rank=0,
            world=1,
            device=torch.device("cpu"),
            edges=edges,
            steps_per_epoch=[p.num_steps for p in plans],
            epochs=[{"hash": p.content_hash, "metrics": {}} for p in plans],
            run_dir=d,
        )
        held = rank_eval_batches(cfg, corpus.held_out, top=edges[-1], rank=0, world_size=1)
        t = Trainer(cfg, spec, save=lambda *a: None, eval_batches=held)
        t.resume(None)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            t.fit(_batches(cfg, corpus, plans), NullLogger())
        wall = time.perf_counter() - t0
    h, ev = t.history.arrays(), t.evals.arrays()
    real = np.cumsum(h["real"])
    at = np.concatenate([[0.0], real])[ev["step"].astype(int)]
    return {
        "edges": edges,
        "steps": int(t.steps_done),
        "steps_per_epoch": spec.steps_per_epoch,
        "wall_s": wall,
        "real_tokens": float(real[-1]),
        "padded_tokens": float(h["padded"].sum()),
        "eval": {
            "step": ev["step"].astype(int).tolist(),
            "real_tokens": at.tolist(),
            "loss": ev["loss"].tolist(),
            "loss_per_sample": ev["loss_per_sample"].tolist(),
            "accuracy": ev["accuracy"].tolist(),
        },
        "step_real": h["real"].tolist(),
        "train_loss": h["loss"].tolist(),
    }


def measure_throughput(
    configs: dict[str, RunConfig], corpus: Corpus, *, steps: int = 16, rounds: int = 3
) -> dict:
    """Seconds per real token of each policy's full training steps on its own epoch-0
    micro-batches (`steps` of them, spread evenly over the epoch), the policies taking turns
    step by step, `rounds` times; per round and the median."""
    import torch

    from pipeline.learn.factory import build_model
    from pipeline.learn.optim import build_optimizer
    from pipeline.train.step import train_group

    work = {}
    for name, cfg in configs.items():
        edges = [int(e) for e in resolve_edges(cfg, corpus.lengths)]
        plan = _plans(cfg, corpus, edges)[0]
        every = max(1, plan.num_steps // steps)
        mbs = list(_batches(cfg, corpus, [plan])(0, 0))[::every][:steps]
        torch.manual_seed(0)
        model = build_model(cfg.model, max_positions=edges[-1])
        work[name] = (model, build_optimizer(model, cfg.train), mbs)
    per_round = {n: [] for n in work}
    cpu = torch.device("cpu")
    for r in range(rounds):
        spent = {n: 0.0 for n in work}
        real = {n: 0 for n in work}
        names = list(work)
        for i in range(steps):
            for n in names[r % len(names) :] + names[: r % len(names)]:
                model, opt, mbs = work[n]
                if i >= len(mbs):
                    continue
                t0 = time.perf_counter()
                train_group(model, [mbs[i]], device=cpu, world_size=1)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                spent[n] += time.perf_counter() - t0
                real[n] += mbs[i].num_real_tokens
        for n in work:
            per_round[n].append(spent[n] / max(real[n], 1))
    # Ratios within a round cancel the machine's slow phases; the absolute rate is the median
    # of the first policy's (the time reference's) rounds.
    ref = np.asarray(per_round[names[0]])
    out = {}
    for n, v in per_round.items():
        ratio = np.asarray(v) / ref
        out[n] = {
            "s_per_real_token": float(np.median(ref) * np.median(ratio)),
            "rounds": v,
            "ratio_to_reference": ratio.tolist(),
        }
    return out


def speed_vs_sorted(throughput: dict) -> tuple[float, list[float]]:
    """A policy's real tokens/s over sorted-static's, from its `measure_throughput` entry: the
    inverse of its median per-round ratio of seconds per real token, and each round's."""
    ratios = throughput["ratio_to_reference"]
    return 1 / float(np.median(ratios)), [1 / r for r in ratios]


def summarize(results: dict) -> dict:
    """Per question and policy: the final held-out loss (mean, spread = max - min over seeds,
    each seed's). With a measured throughput, the equal-time question from the optimisation
    runs: each seed's loss at sorted-static's time for its epochs and the time it first
    reaches sorted-static's mean final loss (None: not within its run)."""
    out: dict = {}
    runs = results.get("runs", {})
    out["optimisation"] = {
        name: _row(
            by_seed,
            [r["eval"]["loss"][-1] for r in by_seed.values()],
            loss_per_sample_mean=float(
                np.mean([r["eval"]["loss_per_sample"][-1] for r in by_seed.values()])
            ),
            steps=[r["steps"] for r in by_seed.values()],
            real_tokens=float(np.mean([r["real_tokens"] for r in by_seed.values()])),
        )
        for name, by_seed in runs.get("optimisation", {}).items()
    }
    tp = results.get("throughput")
    opt = runs.get("optimisation", {})
    if tp and "sorted" in opt and "sorted" in tp:
        ref = opt["sorted"]
        budget = (
            float(np.mean([r["real_tokens"] for r in ref.values()]))
            * tp["sorted"]["s_per_real_token"]
        )
        target = out["optimisation"]["sorted"]["mean"]
        table = {}
        for name, by_seed in opt.items():
            if name not in tp:
                continue
            rate = tp[name]["s_per_real_token"]
            at, reach, done = [], [], []
            for r in by_seed.values():
                t = np.asarray(r["eval"]["real_tokens"], float) * rate
                loss = np.asarray(r["eval"]["loss"], float)
                at.append(float(np.interp(min(budget, t[-1]), t, loss)))
                hit = np.flatnonzero(loss <= target)
                reach.append(float(t[hit[0]]) if len(hit) else None)
                done.append(float(t[-1]))
            table[name] = _row(
                by_seed,
                at,
                s_per_real_token=rate,
                time_to_sorted_loss_s=reach,
                run_s=done,
                budget_s=budget,
            )
        out["time"] = table
    return out


def _row(by_seed: dict, loss: list[float], **more) -> dict:
    return {
        "seeds": sorted(by_seed, key=int),
        "loss": loss,
        "mean": float(np.mean(loss)),
        "spread": float(np.max(loss) - np.min(loss)),
        **more,
    }


_CORPUS: Corpus | None = None


def _worker_init(work: str, samples: int) -> None:
    """A run process: one torch thread (as a Ray worker with one CPU), the corpus loaded once."""
    import torch

    global _CORPUS
    torch.set_num_threads(1)
    _CORPUS = load_corpus(Path(work), samples, 512)


def _worker_run(cfg_json: dict) -> dict:
    return train_run(RunConfig.model_validate(cfg_json), _CORPUS)


def _run_all(tasks, *, corpus_args, jobs: int, results: dict, out: Path) -> None:
    """Every (question, policy, seed, config) in `tasks`, `jobs` processes at a time, each
    result saved as it arrives."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    if not tasks:
        return
    print(f"outcome: {len(tasks)} training runs, {jobs} at a time", flush=True)
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker_init,
                             initargs=corpus_args) as pool:  # fmt: skip
        futs = {
            pool.submit(_worker_run, c.model_dump(mode="json")): (q, n, s) for q, n, s, c in tasks
        }
        for i, f in enumerate(as_completed(futs), 1):
            q, name, seed = futs[f]
            r = f.result()
            results["runs"].setdefault(q, {}).setdefault(name, {})[str(seed)] = r
            _save(out, results)
            print(
                f"outcome: [{i}/{len(tasks)}] {q} {name} seed {seed}: {r['steps']} steps, "
                f"held-out loss {r['eval']['loss'][-1]:.4f} ({r['wall_s']:.0f} s; "
                f"{(time.perf_counter() - t0) / 60:.0f} min so far)",
                flush=True,
            )


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}"


def _save(path: Path, results: dict) -> None:
    """Write `results`, keeping what another invocation wrote to the file meanwhile (its runs,
    its throughput)."""
    if path.is_file():
        disk = json.loads(path.read_text())
        for q, by_name in disk.get("runs", {}).items():
            for name, by_seed in by_name.items():
                for seed, r in by_seed.items():
                    results["runs"].setdefault(q, {}).setdefault(name, {}).setdefault(seed, r)
        for k, v in disk.items():
            results.setdefault(k, v)
    results["summary"] = summarize(results)
    write_json(path, results)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/outcome.json")
    ap.add_argument("--work", default="out/outcome")
    ap.add_argument("--samples", type=int, default=6000)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--batch-size", type=int, default=64, help="question 1: samples per step")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--questions", default="optimisation,time")
    ap.add_argument("--throughput-rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at once")
    args = ap.parse_args(argv)

    out, work = Path(args.out), Path(args.work)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(out.read_text()) if out.is_file() else {}
    corpus = load_corpus(work, args.samples, 512)
    seeds = [int(s) for s in args.seeds.split(",")]
    policies = args.policies.split(",")
    results.update(
        machine=_machine(),
        corpus=corpus.summary,
        epochs=args.epochs,
        eval_every=args.eval_every,
        batch_size=args.batch_size,
        heldout_tokens=corpus.held_out.num_tokens,
    )
    # Each invocation's command is kept: the runs and the throughput may come from two.
    cmd = " ".join(["python -m bench.outcome", *(sys.argv[1:] if argv is None else argv)])
    if cmd not in results.get("command", ""):
        results["command"] = "; ".join(c for c in (results.get("command"), cmd) if c)
    results.setdefault("runs", {})
    results.setdefault("date_utc", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"))

    def cfg(name, seed):
        return policy_config(
            name, corpus=corpus, seed=seed, epochs=args.epochs, eval_every=args.eval_every,
            batch_size=args.batch_size,
        )  # fmt: skip

    tasks: list[tuple] = []
    questions = args.questions.split(",")
    if "optimisation" in questions:
        for seed in seeds:
            for name in policies:
                if str(seed) not in results["runs"].get("optimisation", {}).get(name, {}):
                    tasks.append(("optimisation", name, seed, cfg(name, seed)))
    if "time" in questions and "throughput" not in results:
        print("outcome: throughput, every policy's steps taking turns", flush=True)
        with torch_threads(1):
            results["throughput"] = measure_throughput(
                {n: cfg(n, 0) for n in policies}, corpus, rounds=args.throughput_rounds
            )
        results["throughput_date_utc"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        _save(out, results)
    _run_all(tasks, corpus_args=(str(work), args.samples), jobs=args.jobs, results=results, out=out)
    _save(out, results)
    png = plot_outcome(results, out.with_suffix(".png"), LABELS)
    print(f"outcome: wrote {out} and {png}", flush=True)
    return results


if __name__ == "__main__":
    main()
