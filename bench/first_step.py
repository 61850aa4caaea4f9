"""Time to the first step, and what delivery costs past it, with chapters and a lead-in.

`measure_first_steps` runs the feeder as training does (prefetch on, consumers asking at once):
a cold start at step 0 consumed through the first `chapters` regular chapters, then a restart
inside a chapter (a new feeder, as a resumed run gets) consumed for a few steps. It reports:

- the time to the first micro-batch of every consumer, cold and after the restart, from the
  feeder's start with the length index cached; the index's own build (once per corpus) apart.
  With delivery.row_cache the first cold run starts on an empty row cache (a corpus this node has
  not prepared before) and fills it; the second goes through the same chapters again from the
  filled cache (`warm`), and the later starts find it filled too;
- each consumer's rate on the blocks it was handed: real tokens over the time spent in the
  stream outside waits for a range (the first micro-batch of each range holds the wait for the
  feeder, and is counted as waiting); and the share of wall time spent waiting;
- the feeder's preparation rate: real tokens prepared over the seconds its preparations took;
- the object store's peak above its level before the feeder started, the feeder's and this
  process's peak RSS;
- the parquet bytes the epoch reads with and without the lead-in, estimated from the index
  (`chapters.chapter_read_bytes`), as multiples of the corpus.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

from bench.probes import RssPeak, StorePeak
from pipeline.core.chapters import chapter_read_bytes, row_group_of
from pipeline.core.config import DEFAULT_TOKEN_BUDGET, RunConfig
from pipeline.core.epochs import epoch_plan_for, resolve_edges
from pipeline.core.ranges import EpochRanges
from pipeline.data import build_length_index, rank_batches, start_feeder, stop_feeder
from pipeline.data.corpus import write_corpus
from pipeline.data.rowcache import RowCache

__all__ = ["measure_first_steps", "read_amplification"]

FEEDER = "bucketray-bench-first-step"


def _consume(name: str, rank: int, world: int, start: int, stop: int) -> dict:
    """Micro-batches of steps [start, stop): each one's step, real tokens and the seconds the
    stream took to yield it; when the consumer began, got its first and ended."""
    began = time.time()
    steps, real, secs = [], [], []
    first = None
    it = rank_batches(name, epoch=0, start_step=start, rank=rank, world_size=world)
    t = time.perf_counter()
    for mb in it:
        secs.append(time.perf_counter() - t)
        first = time.time() if first is None else first
        steps.append(mb.step)
        real.append(mb.num_real_tokens)
        if mb.step + 1 >= stop:
            break
        t = time.perf_counter()
    it.close()
    return {
        "began": began,
        "first": first,
        "end": time.time(),
        "steps": steps,
        "real": real,
        "secs": secs,
    }


def _rates(res: list[dict], range_starts: set) -> tuple[float, float]:
    """(median over consumers of real tokens per second outside waits, median wait share of the
    wall time): the first micro-batch of each range holds the wait for the feeder."""
    rate, share = [], []
    for r in res:
        waiting = np.isin(np.asarray(r["steps"]), list(range_starts))
        secs, real = np.asarray(r["secs"]), np.asarray(r["real"], dtype=np.float64)
        busy = float(secs[~waiting].sum())
        rate.append(float(real[~waiting].sum()) / busy if busy else 0.0)
        share.append(float(secs[waiting].sum()) / (r["end"] - r["began"]))
    return float(statistics.median(rate)), float(statistics.median(share))


class _Consumer:
    """A consumer process started and warmed (imports done) before the clock starts, as a
    Ray Train worker is by the time it asks for its first batch. Zero CPUs: it mostly waits,
    and a CPU it held would be one the feeder's sort tasks could not get."""

    def warm(self) -> int:
        # What a Ray Train worker has loaded before its first batch: ray.train.torch brings
        # torch and pandas (pyarrow's to_numpy imports pandas on first use, ~1 s here).
        import ray.train.torch  # noqa: F401

        import pipeline.data.rechunk  # noqa: F401

        return 0

    def consume(self, *args) -> dict:
        return _consume(*args)


def _run(cfg, index, edges, path, start, stop, consumers) -> dict:
    import ray

    pool = [ray.remote(num_cpus=0)(_Consumer).remote() for _ in range(consumers)]
    ray.get([c.warm.remote() for c in pool])
    with StorePeak() as store:
        t0 = time.time()
        feeder = start_feeder(cfg, index, edges, name=FEEDER, path=path, prefetch=True)
        calls = [c.consume.remote(FEEDER, r, consumers, start, stop) for r, c in enumerate(pool)]
        pid = ray.get(feeder.__ray_call__.remote(lambda self: os.getpid()))
        rss = RssPeak([pid, os.getpid()])
        res = ray.get(calls)
        hist = ray.get(feeder.history.remote())
        feeder_rss, driver_rss = rss.close()
        stop_feeder(FEEDER)
    for c in pool:
        ray.kill(c)
    prep = [h["plan_s"] + h["sort_s"] + h["split_s"] for h in hist]  # each preparation's seconds
    prep_s = sum(prep)
    rate, wait = _rates(res, {h["start_step"] for h in hist})
    return {
        "start_step": start,
        "stop_step": stop,
        "first_step_s": max(r["first"] for r in res) - t0,
        "first_range": {k: hist[0][k] for k in ("start_step", "end_step", "tokens", "in_feeder")},
        "first_range_prepare_s": prep[0],
        "first_range_ready_s": hist[0]["done_at"] - t0,
        "ranges": [(h["start_step"], h["end_step"], h["tokens"], h["in_feeder"]) for h in hist],
        # each range's preparation: its seconds, and where its row groups came from
        "range_reads": [
            {"prepare_s": p} | {k: h.get(k, 0) for k in ("rg_cached", "rg_filled", "rg_parquet")}
            for h, p in zip(hist, prep, strict=True)
        ],
        "consumer_tokens_per_s": rate,
        "wait_fraction": wait,
        "prepared_tokens": int(sum(h["tokens"] for h in hist)),
        "prepare_s": prep_s,
        "prepare_tokens_per_s": sum(h["tokens"] for h in hist) / prep_s if prep_s else 0.0,
        "peak_object_store_bytes": store.peak,
        "spilled_bytes": store.spilled,
        "feeder_peak_rss_bytes": feeder_rss,
        "driver_peak_rss_bytes": driver_rss,
        "feeder_peak_private_bytes": rss.anon[0],  # of it, not shared
        "max_range_bytes": max(h["bytes"] for h in hist),
    }


def read_amplification(cfg: RunConfig, index, edges, world: int) -> dict:
    """Parquet bytes one epoch reads (index estimate, row groups weighted by their rows' ids),
    without and with a lead-in at step 0, as multiples of the corpus."""
    plan = epoch_plan_for(cfg, index, edges, 0, world)
    d = cfg.delivery_used
    ranges = EpochRanges.of(plan, d)  # as the feeder cuts it
    b = ranges.bounds
    rg = row_group_of(index.file_idx, index.rows, index.row_groups)
    rg_tokens = np.bincount(rg, weights=index.lengths.astype(np.float64))
    rg_bytes = 4.0 * rg_tokens + 8.0 * np.bincount(rg)  # int32 ids and int64 sample ids
    pos = np.searchsorted(index.sample_ids, plan.sample_ids)
    out = {"chapters": int(b.size - 1)}
    cut = b
    if d.lead_tokens:
        lead = ranges.lead_in(0, d.lead_tokens)
        cut = np.unique(np.concatenate([lead, b]))
    for name, bounds in (("chapters", b), ("with_lead_in", cut)):
        r = chapter_read_bytes(plan, bounds, rg[pos], rg_bytes)
        out[name + "_amplification"] = r["amplification"]
    out["ranges_with_lead_in"] = int(cut.size - 1)
    out["corpus_bytes"] = float(rg_bytes.sum())
    return out


def measure_first_steps(
    num_samples: int,
    consumers: int = 2,
    *,
    shards: int = 8,
    chapters: int = 2,
    resume_steps: int = 8,
    repeats: int = 3,
    resumes: int | None = None,
    vocab_size: int = 512,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    delivery: dict | None = None,
    data_dir: str | None = None,
) -> dict:
    """The cold start through `chapters` chapters and a restart mid-chapter (see the module
    docstring); `delivery` overrides fields of the delivery section (chapter_tokens, lead_tokens).

    Times to the first step are noisy on a shared machine: the cold start and the restart
    each run `repeats` times (the extra cold starts stop after `resume_steps` steps, except
    the row cache's `warm` run), and `first_step_cold_s` / `first_step_resume_s` hold every
    time measured, in run order; the "cold" and "resume" dicts are the first run of each.
    `resumes`: how many restarts to time (default `repeats`; 0: none, "resume" is then None)."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    data_dir = data_dir or f"data/bench/seed902k-{num_samples}-{shards}"
    write_corpus(data_dir, num_samples=num_samples, shards=shards, vocab_size=vocab_size)
    with tempfile.TemporaryDirectory(prefix="bucketray-bench-index-") as cache:
        cfg = RunConfig.model_validate(
            {
                "data": {"path": data_dir, "cache_dir": cache},
                "delivery": delivery or {},
                "batching": {"token_budget": token_budget},
                "model": {"vocab_size": vocab_size},
                "scaling": {"num_workers": consumers},
            }
        )
        t = time.perf_counter()
        index = build_length_index(cfg)
        index_s = time.perf_counter() - t
        t = time.perf_counter()
        edges = resolve_edges(cfg, index.lengths)
        edges_s = time.perf_counter() - t
        t = time.perf_counter()
        plan = epoch_plan_for(cfg, index, edges, 0, consumers)
        plan_s = time.perf_counter() - t
        d = cfg.delivery_used
        b = EpochRanges.of(plan, d).bounds
        c = min(chapters, b.size - 1)
        cold = _run(cfg, index, edges, data_dir, 0, int(b[c]), consumers)
        colds = [cold]
        warm = None
        if d.row_cache and repeats > 1:  # the same chapters again, from the filled row cache
            warm = _run(cfg, index, edges, data_dir, 0, int(b[c]), consumers)
            colds.append(warm)
        colds += [
            _run(cfg, index, edges, data_dir, 0, resume_steps, consumers)
            for _ in range(repeats - len(colds))
        ]
        # a restart inside the chapter after the cold run's last: half-way through it
        k = min(c, b.size - 2)
        mid = int(b[k] + b[k + 1]) // 2
        restarts = [
            _run(cfg, index, edges, data_dir, mid, mid + resume_steps, consumers)
            for _ in range(repeats if resumes is None else resumes)
        ]
        resume = restarts[0] if restarts else None
        reads = read_amplification(cfg, index, edges, consumers)
        rows = RowCache.for_run(cfg, index)
        row_cache_bytes = (
            sum(e.stat().st_size for e in os.scandir(rows.root) if e.name.endswith(".arrow"))
            if rows is not None and os.path.isdir(rows.root)
            else 0
        )
    return {
        "num_samples": num_samples,
        "num_tokens": index.num_tokens,
        "consumers": consumers,
        "chapter_tokens": d.chapter_tokens,
        "lead_tokens": d.lead_tokens,
        "chapters": int(b.size - 1),
        "chapters_run": c,
        "index_build_s": index_s,
        "edges_s": edges_s,
        "plan_s": plan_s,
        "cold": cold,
        "warm": warm,
        "resume": resume,
        "row_cache": d.row_cache,
        "row_groups": int(sum(len(r) for r in index.row_groups)),
        "row_cache_bytes": row_cache_bytes,
        "first_step_cold_s": [r["first_step_s"] for r in colds],
        "first_step_resume_s": [r["first_step_s"] for r in restarts],
        "reads": reads,
    }
