"""The benchmark suite: one function per section, each returning a JSON-ready dict.

Sections 1 and 3 (plans) are pure numpy on the seed-calibrated preset; sections 2 and 4 share
one private local Ray cluster. `run_suite` runs what `SuiteOptions` asks for and records the
machine, the load and what was reduced or skipped, so the rendered document can say so.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bench.fullbatch import budget_table, hf_fidelity
from bench.padding import BATCHINGS, padding_table, planning_costs
from bench.quality import loss_readability, recomposition_table
from bench.training import POLICIES, measure_training, run_summary
from pipeline.core.synthetic import PRESETS, seed902k_lengths

__all__ = [
    "SuiteOptions",
    "machine_info",
    "section_padding",
    "section_quality",
    "section_training",
    "section_delivery",
    "section_gpu",
    "run_suite",
]

# Where `scripts/gpu_smoke.sh --set train.metrics_file=$PWD/out/gpu_smoke/metrics.jsonl` leaves
# its rank-0 metrics; when present, the GPU row of section 2 is filled from it.
GPU_METRICS = "out/gpu_smoke/metrics.jsonl"


@dataclass
class SuiteOptions:
    """What to run and at which scale (the CLI's flags; `quick` shrinks everything)."""

    samples: int = PRESETS["seed902k"]
    scale_factor: int = 10  # planning cost is also timed at samples x scale_factor
    timing_repeats: int = 5
    training: bool = True
    train_samples: int = 3000
    train_max_length: int = 512
    train_repeats: int = 3
    train_token_budget_rounds: int = 1  # extra rounds under a token budget (0: skip)
    realtext_steps: int = 300  # steps on the real-text corpus (bench.realtext; 0: skip)
    packed_samples: int = 6000  # "Packed rows": demo corpus size (bench.packed_training)
    packed_repeats: int = 2  # "Packed rows": training rounds (0: skip the section)
    delivery: bool = True
    delivery_samples: list[int] = field(default_factory=lambda: [100_000])
    delivery_repeats: int = 3
    full_delivery_repeats: int = 1  # epochs at 902K: each sorts ~1 GB (~80 s on 2 cores)
    # Below 902K: one cold epoch whole and one in chapters of this many tokens (None: skip).
    delivery_chapter_tokens: int | None = 2**25
    # One cold epoch whole and one in chapters of delivery.chapter_tokens' default at these sizes
    # too: memory against corpus size, with and without chapters (None in measure_chapters).
    chapter_samples: list[int] = field(default_factory=lambda: [PRESETS["seed902k"]])
    # Time to the first step, cold and after a restart mid-chapter, and the delivery rates past
    # it (bench.first_step), with the delivery section's defaults unless overridden here.
    first_step_samples: list[int] = field(default_factory=lambda: [100_000, 902_087, 2_000_000])
    # Starts repeated at sizes up to the preset's (the median is reported); once above it.
    first_step_repeats: int = 3
    first_step_chapters: int = 2  # chapters the cold run goes through (the next is prefetched)
    first_step_delivery: dict = field(default_factory=dict)
    work_dir: str = "out/bench"
    gpu_metrics: str = GPU_METRICS
    quick: bool = False

    @classmethod
    def quick_variant(cls, **kw) -> SuiteOptions:
        """A smoke run of every section in a few minutes: small presets, one round each."""
        base = dict(
            samples=50_000,
            scale_factor=4,
            timing_repeats=2,
            train_samples=600,
            train_max_length=128,
            train_repeats=1,
            train_token_budget_rounds=0,
            realtext_steps=40,
            packed_samples=600,
            packed_repeats=1,
            delivery_samples=[5_000],
            delivery_repeats=1,
            delivery_chapter_tokens=2**20,
            chapter_samples=[],
            first_step_samples=[5_000],
            first_step_chapters=2,
            first_step_repeats=2,
            first_step_delivery={"chapter_tokens": 2**21, "lead_tokens": 2**15},
            quick=True,
        )
        return cls(**(base | kw))


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _loadavg() -> list[float]:
    parts = _read("/proc/loadavg").split()
    return [float(x) for x in parts[:3]] if parts else []


def machine_info() -> dict:
    """CPU model, cores, RAM, library versions and the git commit the numbers belong to."""
    import pyarrow
    import torch

    try:
        import ray

        ray_version = ray.__version__
    except ImportError:  # the pure sections run without Ray
        ray_version = None
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in _read("/proc/cpuinfo").splitlines()
            if ln.startswith("model name")
        ),
        platform.processor() or platform.machine(),
    )
    mem_kb = next(
        (
            int(ln.split()[1])
            for ln in _read("/proc/meminfo").splitlines()
            if ln.startswith("MemTotal")
        ),
        0,
    )

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kb / 2**20, 1),
        "gpu": _gpu_name(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray_version,
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
        "platform": platform.platform(),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def _gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def section_padding(lengths: np.ndarray, lengths_big: np.ndarray | None, repeats: int) -> dict:
    """Section 1: the padding table at B=32 and at a token budget, and planning costs."""
    out = padding_table(lengths)
    out["budget"] = budget_table(lengths, repeats=repeats)
    out["hf_fidelity"] = hf_fidelity(lengths)
    sizes = {"preset": lengths}
    if lengths_big is not None:
        sizes["scaled"] = lengths_big
    out["costs"] = planning_costs(sizes, repeats=repeats)
    return out


def section_quality(lengths: np.ndarray, padding: dict) -> dict:
    """Section 3 from plans: recomposition and switch rate for each batching of section 1."""
    out: dict = {"samples": int(np.asarray(lengths).size), "recomposition": {}}
    for name, block in padding["batchings"].items():
        edge_sets = {
            p["name"]: p["edges"]
            for p in block["policies"]
            if p["edges"] is not None and p["name"] in ("edges:team", "optimal:32", "optimal:auto")
        }
        rows = recomposition_table(lengths, edge_sets, BATCHINGS[name])
        b = BATCHINGS[name]
        label = (
            f"micro-batch {b.batch_size}"
            if b.mode == "fixed"
            else f"token budget {b.token_budget:,}"
        )
        out["recomposition"][name] = {"label": label, "auto_k": block["auto"]["k"], "rows": rows}
    return out


def section_training(opts: SuiteOptions, log: Callable[[str], None]) -> dict:
    """Section 2 (and the loss-readability part of section 3): training under each policy."""
    work = Path(opts.work_dir) / "train"
    out = measure_training(
        work,
        num_samples=opts.train_samples,
        max_length=opts.train_max_length,
        repeats=opts.train_repeats,
        log=log,
    )
    out["readability"] = {}
    for p in ("edges:team", "optimal:auto"):
        curves = out["policies"][p]["curves"]
        # The first steps come before every bucket has a running loss: leave a quarter out.
        out["readability"][p] = loss_readability(curves, skip=len(curves["loss"]) // 4)
    if opts.train_token_budget_rounds:
        budget = {"mode": "token_budget", "token_budget": 32 * opts.train_max_length}
        tb = measure_training(
            work,
            num_samples=opts.train_samples,
            max_length=opts.train_max_length,
            batching=budget,
            repeats=opts.train_token_budget_rounds,
            log=log,
        )
        for p in tb["policies"].values():
            p.pop("curves")
        out["token_budget"] = tb
    return out


def section_delivery(opts: SuiteOptions, log: Callable[[str], None]) -> dict:
    """Section 4: Ray Data delivery per consumer and epoch preparation (bench.delivery)."""
    from bench.delivery import measure_delivery

    runs = {}
    for n in opts.delivery_samples:
        full = n >= PRESETS["seed902k"]
        shards = _shards(n)
        repeats = opts.full_delivery_repeats if full else opts.delivery_repeats
        log(f"delivery: {n:,} samples in {shards} shards, 2 consumers, {repeats} epochs")
        t = time.perf_counter()
        r = measure_delivery(
            n, 2, shards=shards, repeats=repeats, data_dir=f"data/bench/seed902k-{n}-{shards}"
        )
        if opts.delivery_chapter_tokens and not full:
            from bench.delivery import measure_chapters

            log(f"delivery: {n:,} samples, one cold epoch whole and one in chapters")
            r["chapters"] = measure_chapters(
                n,
                2,
                (None, opts.delivery_chapter_tokens),
                shards=shards,
                data_dir=f"data/bench/seed902k-{n}-{shards}",
            )
        r["wall_s"] = time.perf_counter() - t
        runs[str(n)] = r
    return {"runs": runs, "chapters": _chapters(opts, log), "first_steps": _first_steps(opts, log)}


def _shards(n: int) -> int:
    """Shards of the bench corpus of `n` samples: ~28K samples per shard from the preset's
    size up, as its 32 shards hold; 8 below."""
    big = n >= PRESETS["seed902k"]
    return 32 * max(1, round(n / PRESETS["seed902k"])) if big else 8


def _chapters(opts: SuiteOptions, log: Callable[[str], None]) -> list[dict]:
    """measure_chapters at `opts.chapter_samples`: the whole epoch, then chapters of the
    default size; each row gets its corpus size."""
    from bench.delivery import measure_chapters
    from pipeline.core.deliveryconfig import DEFAULT_CHAPTER_TOKENS

    out = []
    for n in opts.chapter_samples:
        shards = _shards(n)
        log(f"delivery: {n:,} samples, one cold epoch whole and one in default chapters")
        rows = measure_chapters(
            n,
            2,
            (None, DEFAULT_CHAPTER_TOKENS),
            shards=shards,
            data_dir=f"data/bench/seed902k-{n}-{shards}",
        )
        out += [c | {"num_samples": n} for c in rows]
    return out


def _first_steps(opts: SuiteOptions, log: Callable[[str], None]) -> list[dict]:
    from bench.first_step import measure_first_steps

    out = []
    for n in opts.first_step_samples:
        shards = _shards(n)
        log(f"delivery: {n:,} samples, time to the first step cold and after a restart")
        t = time.perf_counter()
        r = measure_first_steps(
            n,
            2,
            shards=shards,
            chapters=opts.first_step_chapters,
            # above the preset: a start on the empty row cache and one on the filled cache
            repeats=opts.first_step_repeats if n <= PRESETS["seed902k"] else 2,
            delivery=opts.first_step_delivery,
            data_dir=f"data/bench/seed902k-{n}-{shards}",
        )
        out.append(r | {"wall_s": time.perf_counter() - t})
    return out


def section_gpu(path: str) -> dict:
    """The GPU row: a bucketed run's throughput from gpu_smoke.sh's metrics file, if one exists."""
    import json

    f = Path(path)
    if not f.is_file():
        reason = "no CUDA GPU on this machine" if _gpu_name() is None else f"{path} not found"
        return {"skipped": reason, "metrics_file": path}
    records = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    s = run_summary(records)
    for k in ("loss", "loss_debiased", "bucket", "loss_by_bucket"):
        s.pop(k)
    return {"metrics_file": path, **s}


def run_suite(
    opts: SuiteOptions,
    *,
    command: str,
    log: Callable[[str], None] = print,
    save: Callable[[dict], None] = lambda _: None,
) -> dict:
    """Run every enabled section; the returned dict is what BENCHMARKS.md is rendered from.

    `save` receives the results after each section, so a run killed part-way (the OS's
    out-of-memory killer on a shared machine) still leaves the finished sections on disk.
    """
    t0 = time.perf_counter()
    meta = {
        "command": command,
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "load_before": _loadavg(),
        "options": asdict(opts),
        "skipped": [],
    }
    results: dict = {"meta": meta}

    lengths = seed902k_lengths(opts.samples).astype(np.int64)
    big = None
    if opts.scale_factor > 1:
        big = seed902k_lengths(opts.samples * opts.scale_factor).astype(np.int64)
    log(f"section 1: padding and planning on {opts.samples:,} samples")
    results["padding"] = section_padding(lengths, big, opts.timing_repeats)
    log("section 3: recomposition and switch rate from plans")
    results["quality"] = section_quality(lengths, results["padding"])
    save(results)

    started = None
    if opts.training or opts.delivery:
        from pipeline.data.connect import connect

        # A private instance, or the one already up (a caller's, a test session's).
        started = connect("local", num_cpus=2, include_dashboard=False, log_to_driver=False)[1]
    try:
        if opts.training:
            log("section 2: training under each policy")
            results["training"] = section_training(opts, log)
            save(results)
            if opts.realtext_steps:
                from bench.realtext import measure_realtext

                log("section 2: real text (the stdlib corpus), readability and per-bucket loss")
                work = Path(opts.work_dir) / "realtext"
                max_length = opts.train_max_length
                results["training"]["realtext"] = measure_realtext(
                    work, max_length=max_length, max_steps=opts.realtext_steps, log=log
                )
                save(results)
            if opts.packed_repeats:  # the "Packed rows" section
                from bench.packed_training import section_packed_rows

                results["packed"] = section_packed_rows(opts, log)
                save(results)
        else:
            results["training"] = {"skipped": "--skip-training"}
            meta["skipped"].append("section 2 (training) and the loss curves: --skip-training")
        if opts.delivery:
            log("section 4: delivery")
            results["delivery"] = section_delivery(opts, log)
        else:
            results["delivery"] = {"skipped": "--skip-delivery"}
            meta["skipped"].append("section 4 (delivery): --skip-delivery")
    finally:
        if started is not None:  # ours: stop it; a caller's instance stays up
            import ray

            ray.shutdown()
    results["gpu"] = section_gpu(opts.gpu_metrics)
    meta["load_after"] = _loadavg()
    meta["duration_s"] = time.perf_counter() - t0
    meta["policies"] = list(POLICIES)
    return results
