"""How far one feeder goes: `python -m jobs.sizing` (part of `make bench`).

For each corpus size of the seed-calibrated preset, one chapter size and the default data
settings (row cache on, lead-in on), measures on this machine with the feeder and two
consumers (bench/first_step.py, the machinery of BENCHMARKS.md section 4): length
index build, edges and epoch plan, the first chapter prepared from parquet while the row cache
fills (cold) and again from the filled cache (warm), the row cache's size on disk, the first
step cold and warm, the feeder's peak RSS, the object store's peak and the preparation rate.
Sizes run one at a time; results accumulate in --json (one entry per size, replaced when
measured again) and the Markdown table of all of them is printed. The largest size is opt-in
(--with-9m): its row cache alone takes 43 GB (4.02 B/token), beside the parquet corpus.

    python -m jobs.sizing                     # 902,087 and 2,000,000 samples
    python -m jobs.sizing --samples 902087    # one size
    python -m jobs.sizing --with-9m           # also 9,020,870
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from pipeline.core.deliveryconfig import DEFAULT_CHAPTER_TOKENS
from pipeline.core.synthetic import PRESETS

PROG = "python -m jobs.sizing"
DEFAULT_SIZES = (PRESETS["seed902k"], 2_000_000)
LARGEST = 10 * PRESETS["seed902k"]
GIB = 2**30


def summarize(m: dict) -> dict:
    """The sizing row of one `measure_first_steps` result."""
    cold, warm = m["cold"], m["warm"] or {}
    filled = [r for r in cold["range_reads"] if r.get("rg_filled")]
    return {
        "samples": m["num_samples"],
        "tokens": m["num_tokens"],
        "chapters": m["chapters"],
        "index_build_s": m["index_build_s"],
        "edges_s": m["edges_s"],
        "plan_s": m["plan_s"],
        # The cold run's ranges that decoded row groups into the cache: their preparation time.
        "row_cache_fill_s": sum(r["prepare_s"] for r in filled),
        "row_cache_bytes": m["row_cache_bytes"],
        "row_cache_bytes_per_token": m["row_cache_bytes"] / max(m["num_tokens"], 1),
        "first_step_cold_s": cold["first_step_s"],
        "first_step_warm_s": warm.get("first_step_s"),
        "feeder_peak_rss_bytes": max(
            cold["feeder_peak_rss_bytes"], warm.get("feeder_peak_rss_bytes", 0)
        ),
        "feeder_peak_private_bytes": max(
            cold["feeder_peak_private_bytes"], warm.get("feeder_peak_private_bytes", 0)
        ),
        "peak_object_store_bytes": max(
            cold["peak_object_store_bytes"], warm.get("peak_object_store_bytes", 0)
        ),
        "spilled_bytes": max(cold["spilled_bytes"], warm.get("spilled_bytes", 0)),
        "prepare_tokens_per_s_cold": cold["prepare_tokens_per_s"],
        "prepare_tokens_per_s_warm": warm.get("prepare_tokens_per_s"),
        "consumer_tokens_per_s": warm.get("consumer_tokens_per_s", cold["consumer_tokens_per_s"]),
    }


def render(rows: list[dict]) -> str:
    """The sizing table, one column per corpus size."""
    rows = sorted(rows, key=lambda r: r["samples"])

    def f(v, unit="", scale=1.0, digits=1):
        return "not measured" if v is None else f"{v / scale:,.{digits}f}{unit}"

    lines = [
        ("samples / tokens", lambda r: f"{r['samples']:,} / {r['tokens'] / 1e9:.2f}B"),
        (f"chapters ({DEFAULT_CHAPTER_TOKENS:,} tokens each)", lambda r: str(r["chapters"])),
        ("length index build", lambda r: f(r["index_build_s"], " s")),
        ("edges + epoch plan", lambda r: f(r["edges_s"] + r["plan_s"], " s", digits=2)),
        ("first chapter from parquet, filling the row cache", lambda r: f(r["row_cache_fill_s"], " s")),
        ("row cache on disk", lambda r: f"{r['row_cache_bytes'] / GIB:.2f} GiB ({r['row_cache_bytes_per_token']:.2f} B/token)"),
        ("first step, cold (empty row cache)", lambda r: f(r["first_step_cold_s"], " s", digits=2)),
        ("first step, warm (filled row cache)", lambda r: f(r["first_step_warm_s"], " s", digits=2)),
        ("feeder peak RSS (private)", lambda r: f"{r['feeder_peak_rss_bytes'] / GIB:.2f} GiB ({r['feeder_peak_private_bytes'] / GIB:.2f})"),
        ("object store peak (spilled)", lambda r: f"{r['peak_object_store_bytes'] / GIB:.2f} GiB ({r['spilled_bytes'] / GIB:.2f})"),
        ("preparation rate, cold / warm", lambda r: f"{f(r['prepare_tokens_per_s_cold'], 'M', 1e6)} / {f(r['prepare_tokens_per_s_warm'], 'M', 1e6)} tokens/s"),
        ("consumer rate (per consumer)", lambda r: f(r["consumer_tokens_per_s"], "M tokens/s", 1e6)),
    ]  # fmt: skip
    out = ["| | " + " | ".join(f"{r['samples']:,}" for r in rows) + " |"]
    out.append("|---" * (len(rows) + 1) + "|")
    out += [f"| {name} | " + " | ".join(fn(r) for r in rows) + " |" for name, fn in lines]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, nargs="+", help=f"corpus sizes (default {DEFAULT_SIZES})")
    p.add_argument(
        "--with-9m",
        action="store_true",
        help=f"also {LARGEST:,} samples (43 GB of row cache plus the corpus)",
    )
    p.add_argument("--json", default="benchmarks/sizing.json", help="results (default %(default)s)")
    p.add_argument("--work-dir", default="data/bench", help="corpora (default %(default)s)")
    p.add_argument("--keep-data", action="store_true", help="keep each corpus after its run")
    a = p.parse_args(argv)
    sizes = list(a.samples or DEFAULT_SIZES) + ([LARGEST] if a.with_9m else [])
    if any(n < 1000 for n in sizes):
        print(f"{PROG}: error: --samples must be >= 1000", file=sys.stderr)
        return 2
    from bench.first_step import measure_first_steps

    path = Path(a.json)
    results = json.loads(path.read_text()) if path.is_file() else {}
    for n in sizes:
        data_dir = os.path.join(a.work_dir, f"sizing-{n}")
        print(f"[sizing] {n:,} samples ...", file=sys.stderr, flush=True)
        t, load0 = time.perf_counter(), os.getloadavg()[0]
        m = measure_first_steps(
            n, consumers=2, shards=32, chapters=1, repeats=2, resumes=0, vocab_size=32000,
            data_dir=data_dir,
        )  # fmt: skip
        row = summarize(m) | {
            "wall_s": time.perf_counter() - t,
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.cpu_count()} cores, {platform.machine()}",
            # A shared machine: other work running beside the measurement slows every figure.
            "load_avg_1m_start_end": [load0, os.getloadavg()[0]],
        }
        results[str(n)] = row
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
        if not a.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
        print(f"[sizing] {n:,} samples: {row['wall_s']:.0f} s", file=sys.stderr, flush=True)
    print(render(list(results.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
