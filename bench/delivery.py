"""Delivery: epoch preparation time and padded tokens/s per consumer, against a baseline.

    python -m bench.delivery --out benchmarks/delivery.json [--quick]

The Ray path is the one training uses: length index (cold and cached), edges, the feeder's
plan-keyed sort and split, then `consumers` Ray tasks (one CPU each) iterating `rank_batches` to
torch tensors, timed inside the task from the feeder call to the last micro-batch. The baseline
is one process with pyarrow and numpy: read the same files, gather each rank's rows in plan
order, and re-chunk and pad them with the same `deliver`, so the ratio isolates data movement.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import run_script
from bench.probes import RssPeak, StorePeak
from pipeline.core.config import DEFAULT_TOKEN_BUDGET, RunConfig
from pipeline.core.deliveryconfig import DeliveryConfig
from pipeline.core.epochs import epoch_plan_for, resolve_edges
from pipeline.core.synthetic import PRESETS
from pipeline.data import deliver, rank_batches, start_feeder, stop_feeder
from pipeline.data.connect import connect
from pipeline.data.corpus import write_corpus
from pipeline.data.index import build_length_index, filesystem_for, list_shards

__all__ = ["baseline_delivery", "main", "measure_chapters", "measure_delivery"]


def _consume(name: str, epoch: int, rank: int, world: int) -> dict:
    t0 = time.perf_counter()
    real = padded = batches = 0
    for mb in rank_batches(name, epoch=epoch, start_step=0, rank=rank, world_size=world):
        real += mb.num_real_tokens
        padded += mb.num_padded_tokens
        batches += 1
    return {"seconds": time.perf_counter() - t0, "real": real, "padded": padded, "batches": batches}


def baseline_delivery(cfg: RunConfig, index, edges, epoch: int, world: int, path: str) -> dict:
    """Single process: pyarrow reads every shard, numpy gathers each rank's rows, `deliver` pads."""
    t0 = time.perf_counter()
    fs, root = filesystem_for(path)
    table = pa.concat_tables(
        [
            pq.read_table(f.path, columns=["sample_id", "input_ids"], filesystem=fs)
            for f in list_shards(fs, root)
        ]
    )
    ids = table["sample_id"].to_numpy()
    by_id = np.argsort(ids, kind="stable")
    t_read = time.perf_counter()
    plan = epoch_plan_for(cfg, index, edges, epoch, world)
    real = 0
    for r in range(world):
        view = plan.rank_view(r)
        rows = by_id[np.searchsorted(ids, view.sample_ids, sorter=by_id)]
        part = table.take(pa.array(rows))
        part = pa.table(
            {
                "sample_id": part["sample_id"],
                "input_ids": part["input_ids"].cast(pa.large_list(pa.int32())),
            }
        )
        for mb in deliver(
            view,
            [part],
            epoch=epoch,
            pad_to_multiple_of=cfg.batching.pad_to_multiple_of,
        ):
            real += mb.num_real_tokens
    t_end = time.perf_counter()
    return {
        "read_s": t_read - t0,
        "serve_s": t_end - t_read,
        "real_tokens": real,
        "tokens_per_s": real / (t_end - t_read),
        "tokens_per_s_incl_read": real / (t_end - t0),
    }


def _timed_index(data_dir: str, token_budget: int, vocab_size: int, consumers: int, cache: str):
    """The run config, the length index built cold (in `cache`, a fresh dir that also holds the
    row cache) and the seconds of the cold and the cached build."""
    cfg = RunConfig.model_validate(
        {
            # One chapter: this measures the whole epoch's sort (chapters: measure_chapters).
            "data": {"path": data_dir, "cache_dir": cache},
            "delivery": {"chapter_tokens": None},
            "batching": {"token_budget": token_budget},
            "model": {"vocab_size": vocab_size},
            "scaling": {"num_workers": consumers},
        }
    )
    t = time.perf_counter()
    index = build_length_index(cfg)  # cold: the cache dir is new
    index_s = time.perf_counter() - t
    t = time.perf_counter()
    cached = build_length_index(cfg)
    index_cached_s = time.perf_counter() - t
    assert cached.from_cache and not index.from_cache
    return cfg, index, index_s, index_cached_s


def _ray_epochs(feeder, name: str, consumers: int, repeats: int):
    """`repeats` epochs through the feeder: each epoch's prepare stats, per-consumer and total
    real tokens/s, and the last epoch's real and padded tokens."""
    import ray

    consume = ray.remote(num_cpus=1)(_consume)
    preps, per_consumer, totals = [], [], []
    for epoch in range(repeats):
        t = time.perf_counter()
        stats = ray.get(feeder.prepare.remote(epoch, consumers, 0))
        stats["prepare_wall_s"] = time.perf_counter() - t
        preps.append(stats)
        results = ray.get([consume.remote(name, epoch, r, consumers) for r in range(consumers)])
        per_consumer.append([x["real"] / x["seconds"] for x in results])
        totals.append(sum(x["real"] for x in results) / max(x["seconds"] for x in results))
        padded = sum(x["padded"] for x in results)
        real = sum(x["real"] for x in results)
    return preps, per_consumer, totals, real, padded


def measure_delivery(
    num_samples: int = 100_000,
    consumers: int = 2,
    *,
    shards: int = 8,
    vocab_size: int = 512,
    repeats: int = 3,
    data_dir: str | None = None,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    seed: int = 0,
    address: str = "local",
) -> dict:
    """Measure the Ray delivery path and the single-process baseline; medians over `repeats` epochs."""
    import ray

    # "local" starts a private cluster with this machine's CPUs; pass "auto" or an address to
    # measure on a running cluster (one that does not answer fails in seconds).
    connect(address, include_dashboard=False, log_to_driver=False, num_cpus=os.cpu_count())
    ray.data.DataContext.get_current().enable_progress_bars = False
    data_dir = data_dir or f"data/bench/seed902k-{num_samples}-{shards}"
    t = time.perf_counter()
    gen = write_corpus(
        data_dir,
        num_samples=num_samples,
        shards=shards,
        vocab_size=vocab_size,
        seed=seed,
        progress=True,
    )
    gen_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory(prefix="bucketray-bench-index-") as cache:
        cfg, index, index_s, index_cached_s = _timed_index(
            data_dir, token_budget, vocab_size, consumers, cache
        )
        t = time.perf_counter()
        edges = resolve_edges(cfg, index.lengths)
        edges_s = time.perf_counter() - t

        name = "bucketray-bench-feeder"
        feeder = start_feeder(cfg, index, edges, name=name, path=data_dir, prefetch=False)
        preps, per_consumer, totals, real, padded = _ray_epochs(feeder, name, consumers, repeats)
        stop_feeder(name)
    base = [baseline_delivery(cfg, index, edges, e, consumers, data_dir) for e in range(repeats)]

    def med(xs):
        return float(statistics.median(xs))

    per_consumer_med = med([v for row in per_consumer for v in row])
    base_tps = med([b["tokens_per_s"] for b in base])
    return {
        "num_samples": index.num_samples,
        "num_tokens": index.num_tokens,
        "shards": shards,
        "consumers": consumers,
        "repeats": repeats,
        "num_buckets": len(edges) - 1,
        "steps_per_epoch": preps[0]["steps"],
        "padding_efficiency": real / padded,
        "generate_s": gen_s if not gen.get("skipped") else 0.0,
        "index_s": index_s,
        "index_cached_s": index_cached_s,
        "edges_s": edges_s,
        "plan_s": med([p["plan_s"] for p in preps]),
        "sort_s": med([p["sort_s"] for p in preps]),
        "split_s": med([p["split_s"] for p in preps]),
        "prepare_wall_s": med([p["prepare_wall_s"] for p in preps]),
        # the first epoch fills the row cache (delivery.row_cache), the later ones read it
        "prepare_first_s": preps[0]["prepare_wall_s"],
        "prepare_later_s": med([p["prepare_wall_s"] for p in preps[1:]]) if repeats > 1 else None,
        "row_cache": cfg.delivery_used.row_cache,
        "ray_tokens_per_s_per_consumer": per_consumer_med,
        "ray_tokens_per_s_per_consumer_all": [[round(v) for v in row] for row in per_consumer],
        "ray_tokens_per_s_total": med(totals),
        "baseline_read_s": med([b["read_s"] for b in base]),
        "baseline_tokens_per_s": base_tps,
        "baseline_tokens_per_s_incl_read": med([b["tokens_per_s_incl_read"] for b in base]),
        "ratio_per_consumer_vs_baseline": per_consumer_med / base_tps,
        "ratio_total_vs_baseline": med(totals) / base_tps,
    }


def _consume_timed(name: str, epoch: int, rank: int, world: int) -> dict:
    """Like `_consume`, with the wall-clock time of the first and the last micro-batch."""
    real = batches = 0
    first = None
    for mb in rank_batches(name, epoch=epoch, start_step=0, rank=rank, world_size=world):
        first = time.time() if first is None else first
        real += mb.num_real_tokens
        batches += 1
    return {"first": first, "end": time.time(), "real": real, "batches": batches}


def measure_chapters(
    num_samples: int = 100_000,
    consumers: int = 2,
    chapter_tokens=(None, 2**25),
    *,
    shards: int = 8,
    vocab_size: int = 512,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    data_dir: str | None = None,
) -> list[dict]:
    """One cold epoch per chapter size (None: the whole epoch in one), as training runs it: the
    feeder starts with prefetch on and the consumers ask for their parts at once. Reports the
    time to the first micro-batch, the epoch's wall time, tokens/s per consumer, the peak of the
    object store above its level before the feeder started, the feeder's own peak of part
    bytes held, and the feeder's and this process's peak RSS."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    data_dir = data_dir or f"data/bench/seed902k-{num_samples}-{shards}"
    write_corpus(data_dir, num_samples=num_samples, shards=shards, vocab_size=vocab_size)
    consume = ray.remote(num_cpus=1)(_consume_timed)
    out = []
    with tempfile.TemporaryDirectory(prefix="bucketray-bench-index-") as cache:
        for ct in chapter_tokens:
            cfg = RunConfig.model_validate(
                {
                    "data": {"path": data_dir, "cache_dir": cache},
                    "delivery": {
                        "chapter_tokens": ct,
                        # each size starts on an empty row cache: its first chapter fills it
                        "row_cache_dir": f"{cache}/rows-{ct}",
                    },
                    "batching": {"token_budget": token_budget},
                    "model": {"vocab_size": vocab_size},
                    "scaling": {"num_workers": consumers},
                }
            )
            index = build_length_index(cfg)
            edges = resolve_edges(cfg, index.lengths)
            name = "bucketray-bench-chapters"
            with StorePeak() as store:
                t0 = time.time()
                feeder = start_feeder(cfg, index, edges, name=name, path=data_dir, prefetch=True)
                calls = [consume.remote(name, 0, r, consumers) for r in range(consumers)]
                pid = ray.get(feeder.__ray_call__.remote(lambda self: os.getpid()))
                rss = RssPeak([pid, os.getpid()])
                res = ray.get(calls)
                hist = ray.get(feeder.history.remote())
                held = ray.get(feeder.memory.remote())
                feeder_rss, driver_rss = rss.close()
                stop_feeder(name)
            first = max(r["first"] for r in res) - t0
            out.append(
                {
                    "chapter_tokens": ct,
                    "chapters": hist[0]["chapters"],
                    "num_tokens": index.num_tokens,
                    "first_step_s": first,
                    "first_chapter_prepare_s": sum(
                        hist[0][k] for k in ("plan_s", "sort_s", "split_s")
                    ),
                    "epoch_s": max(r["end"] for r in res) - t0,
                    "tokens_per_s_per_consumer": float(
                        statistics.median(r["real"] / (r["end"] - r["first"]) for r in res)
                    ),
                    "object_store_base_bytes": store.base,
                    "peak_object_store_bytes": store.peak,
                    "spilled_bytes": store.spilled,
                    "feeder_peak_held_bytes": held["peak_held_bytes"],
                    "feeder_peak_rss_bytes": feeder_rss,
                    "driver_peak_rss_bytes": driver_rss,
                    "feeder_peak_private_bytes": rss.anon[0],  # of it, not shared
                    "max_chapter_bytes": max(h["bytes"] for h in hist),
                }
            )
    return out


def _shards(n: int) -> int:
    """Shards of the bench corpus of `n` samples: ~28K samples per shard from the preset's
    size up, as its 32 shards hold; 8 below."""
    big = n >= PRESETS["seed902k"]
    return 32 * max(1, round(n / PRESETS["seed902k"])) if big else 8


def _corpus(n: int) -> str:
    return f"data/bench/seed902k-{n}-{_shards(n)}"


def measure(args, log) -> dict:
    """The delivery rates, one cold epoch whole and in chapters, and the time to the first step
    cold and after a restart (`bench.first_step`), at the sizes the flags give."""
    from bench.first_step import measure_first_steps

    quick = args.quick
    runs = {}
    for n in [5_000] if quick else args.samples:
        full = n >= PRESETS["seed902k"]
        repeats = 1 if full or quick else 3
        log(f"{n:,} samples in {_shards(n)} shards, 2 consumers, {repeats} epochs")
        t = time.perf_counter()
        r = measure_delivery(n, 2, shards=_shards(n), repeats=repeats, data_dir=_corpus(n))
        if not full:
            log(f"{n:,} samples, one cold epoch whole and one in chapters")
            ct = 2**20 if quick else 2**25
            r["chapters"] = measure_chapters(
                n, 2, (None, ct), shards=_shards(n), data_dir=_corpus(n)
            )
        runs[str(n)] = r | {"wall_s": time.perf_counter() - t}
    chapters = []
    default = DeliveryConfig.model_fields["chapter_tokens"].default
    for n in [] if quick else args.chapter_samples:
        log(f"{n:,} samples, one cold epoch whole and one in default chapters")
        rows = measure_chapters(n, 2, (None, default), shards=_shards(n), data_dir=_corpus(n))
        chapters += [c | {"num_samples": n} for c in rows]
    first_steps = []
    small = {"chapter_tokens": 2**21, "lead_tokens": 2**15} if quick else {}
    for n in [5_000] if quick else args.first_step_samples:
        log(f"{n:,} samples, time to the first step cold and after a restart")
        t = time.perf_counter()
        # above the preset's size: one start on the empty row cache and one on the filled cache
        repeats = 2 if quick or n > PRESETS["seed902k"] else 3
        r = measure_first_steps(
            n, 2, shards=_shards(n), chapters=2, repeats=repeats, delivery=small,
            data_dir=_corpus(n),
        )  # fmt: skip
        first_steps.append(r | {"wall_s": time.perf_counter() - t})
    import ray

    ray.shutdown()
    return {"delivery": {"runs": runs, "chapters": chapters, "first_steps": first_steps}}


def main(argv: list[str] | None = None) -> dict:
    def sizes(text: str) -> list[int]:
        return [int(x) for x in text.split(",")]

    def add_args(p):
        p.add_argument("--samples", type=sizes, default=[100_000], help="delivery rates at")
        p.add_argument(
            "--chapter-samples", type=sizes, default=[PRESETS["seed902k"]],
            help="one cold epoch whole and in default chapters at",
        )  # fmt: skip
        p.add_argument(
            "--first-step-samples", type=sizes, default=[100_000, PRESETS["seed902k"], 2_000_000],
            help="time to the first step at",
        )  # fmt: skip

    return run_script("bench.delivery", __doc__, measure, add_args, argv)


if __name__ == "__main__":
    main()
