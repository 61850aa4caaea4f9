"""BENCHMARKS.md: time to the first step, delivery rates and memory (`bench.first_step`).

Every figure comes from the results dict; the sentences only compare figures it holds.
"""

from __future__ import annotations

import statistics

from bench.render_util import rss_pair, table

__all__ = ["section_first_steps"]

MB = 1e6
RSS_KEYS = ("feeder_peak_rss_bytes", "feeder_peak_private_bytes", "driver_peak_rss_bytes")


def _median(ts: list[float]) -> str:
    """Median (min-max, n runs) of the times measured; one figure where one run was made."""
    if len(ts) == 1:
        return f"{ts[0]:.1f}"
    return f"{statistics.median(ts):.1f} ({min(ts):.1f}-{max(ts):.1f}, {len(ts)} runs)"


def _decodes(run: dict | None, row_groups: int) -> str:
    """Passes over the corpus decoded from parquet in a run: row groups read (narrowly for a
    lead-in's small range, whole to fill the row cache, or whole without it) / row groups."""
    if run is None or not run.get("range_reads") or not row_groups:
        return "-"
    n = sum(r["rg_parquet"] + r["rg_filled"] for r in run["range_reads"])
    return f"{n / row_groups:.2f}"


def _row(x: dict) -> list[str]:
    c, r, w = x["cold"], x["resume"], x.get("warm")
    f, rf = c["first_range"], r["first_range"]
    where = "feeder" if f["in_feeder"] else "Ray Data"
    colds = x.get("first_step_cold_s") or [c["first_step_s"]]
    resumes = x.get("first_step_resume_s") or [r["first_step_s"]]
    cached = x.get("row_cache", False)
    steady = w or c  # rates from the run on the filled row cache where there is one
    mem = lambda k: max(run[k] for run in (c, w) if run)  # noqa: E731
    rg = x.get("row_groups", 0)
    return [
        f"{x['num_samples']:,}",
        f"{x['num_tokens'] / 1e6:,.0f} M",
        f"{x['chapters_run']} of {x['chapters']}",
        f"{x['index_build_s']:.1f}",
        f"{colds[0]:.1f} ({f['tokens']:,} tok, {where})" if cached else "off",
        _median(colds[1:] if cached and len(colds) > 1 else colds),
        f"{_median(resumes)} ({rf['tokens']:,} tok, step {r['start_step']:,})",
        f"{steady['consumer_tokens_per_s'] / 1e6:,.0f}",
        f"{steady['prepare_tokens_per_s'] / 1e6:.1f}",
        f"{steady['wait_fraction']:.0%}",
        f"{mem('peak_object_store_bytes') / MB:,.0f}",
        f"{mem('max_range_bytes') / MB:,.0f}",
        rss_pair({k: mem(k) for k in RSS_KEYS if all(k in run for run in (c, w) if run)}),
        f"{_decodes(c, rg)} / {_decodes(w, rg)}",
        f"{x.get('row_cache_bytes', 0) / 1e9:.2f}" if cached else "off",
        f"{x['reads']['chapters_amplification']:.2f}x / "
        f"{x['reads']['with_lead_in_amplification']:.2f}x",
    ]


def _growth(runs: list[dict]) -> list[str]:
    """The object-store peak and RSS from the smallest to the largest corpus, as ratios."""
    if len(runs) < 2:
        return []
    a, b = runs[0], runs[-1]
    ca, cb = a["cold"], b["cold"]
    ratio = lambda k: cb[k] / ca[k] if ca[k] else float("nan")  # noqa: E731
    return [
        f"From {a['num_samples']:,} to {b['num_samples']:,} samples "
        f"({b['num_tokens'] / a['num_tokens']:.1f}x the tokens) the object-store peak grew "
        f"{ratio('peak_object_store_bytes'):.1f}x, the feeder's RSS peak "
        f"{ratio('feeder_peak_rss_bytes'):.1f}x"
        + (
            f" (its private memory {ratio('feeder_peak_private_bytes'):.1f}x; the rest is "
            "shared: row-cache files it mapped, object-store pages it wrote)"
            if "feeder_peak_private_bytes" in ca and "feeder_peak_private_bytes" in cb
            else ""
        )
        + " and the driver's "
        f"{ratio('driver_peak_rss_bytes'):.1f}x; at {b['num_samples']:,} samples the peak was "
        f"{cb['peak_object_store_bytes'] / max(cb['max_range_bytes'], 1):.1f} times the largest "
        "range prepared.",
        "",
    ]


def section_first_steps(runs: list[dict]) -> list[str]:
    if not runs:
        return []
    x = runs[0]
    lead = x["lead_tokens"]
    out = [
        "",
        "Time to the first step (`bench.first_step.measure_first_steps`): the feeder "
        "started as training starts it (length index cached; its build, once per corpus, apart), "
        "2 consumers asking at once from step 0 and going through the first chapters, then a new "
        "feeder asked to resume half-way through the next chapter, as a restarted run does. "
        "Each consumer is a process warmed as a Ray Train worker is (torch and ray.train "
        "imported). With the row cache (delivery.row_cache) the first cold start finds it empty (a "
        "corpus this node has not prepared before): its lead-in reads parquet and its first "
        "chapter decodes every row group once into the cache; a second cold run then goes "
        "through the same chapters from the filled cache, and the later starts (the extra cold "
        "starts stop after a few steps) and the restarts find it filled. Times: the median with "
        "its range. The rates and the waiting share come from the run on the filled cache where "
        "there is one (else the first cold run), memory from the larger of the two. "
        + (
            f"Lead-in of {lead:,} tokens (delivery.lead_tokens), each next range 4x larger up to the "
            "chapter's end; "
            if lead
            else "No lead-in (delivery.lead_tokens null); "
        )
        + f"chapters of {x['chapter_tokens'] or 0:,} tokens (0: whole epoch). The cold runs stop "
        "after the chapters given, the next one being prefetched by then (the feeder holds about "
        "two chapters at once, so the peak needs no more). Consumer rate: real tokens over the "
        "seconds spent in the stream outside waits for a range (the first micro-batch of each "
        "range, which holds the wait for the feeder, is counted as waiting); preparation rate: "
        "real tokens prepared over the seconds the feeder's preparations took; waiting: share "
        "of each consumer's wall time spent in those first micro-batches. Decodes: passes over "
        "the corpus decoded from parquet (row groups read / row groups) in the first cold run "
        "and in the run on the filled cache. Row cache: its size on disk. Parquet reads: what "
        "one epoch reads without the row cache, as a multiple of the corpus (index estimate), "
        "chapters alone / with the lead-in at step 0. The sizes are "
        "`SuiteOptions.first_step_samples`; above the preset's size each start runs twice (the "
        "first cold start on the empty cache, the second on the filled one), to keep "
        "`make bench` short.",
        "",
    ]
    out += table(
        [
            "samples",
            "tokens",
            "chapters run",
            "index build (s)",
            "first step, empty row cache (s) (first range)",
            "first step cold (s)",
            "first step after restart (s)",
            "consumer Mtok/s",
            "prep Mtok/s",
            "waiting",
            "object store peak (MB)",
            "largest range (MB)",
            "RSS peak feeder (private) / driver (MB)",
            "decodes cold / filled",
            "row cache (GB)",
            "parquet reads per epoch without it",
        ],
        [_row(x) for x in runs],
    )
    out += [""] + _growth(runs)
    out += [
        "The consumers here only pad micro-batches (no model step), so they outrun the feeder "
        "and wait for each range; in training a step's forward and backward pass takes far "
        "longer per token than padding it, and the next range is prepared while the current "
        "one trains, so what matters is that the preparation rate stays above the rate "
        "training consumes tokens.",
        "",
    ]
    return out
