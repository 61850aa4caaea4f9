"""BENCHMARKS.md from the suite's results dict: every number in the document comes from it.

Sections 2 and 3 live in `render_training` and `render_quality`, the time to the first step in
`render_first_step`; the shared goals, names and Markdown helpers in `render_util` (the only
names the renderers share are the public ones those modules export).
"""

from __future__ import annotations

from pathlib import Path

from bench.fullbatch import render_budget
from bench.plots import TEAM_KTOK_S, TEAM_MEASURED
from bench.render_first_step import section_first_steps
from bench.render_packed import section_packed
from bench.render_quality import section_quality
from bench.render_training import section_training
from bench.render_util import (
    GOAL_VS_SORTED,
    READABILITY_GOAL,
    RECOMPOSITION_TARGET,
    by_name,
    pct,
    plural,
    policy_name,
    rel_link,
    rss_pair,
    table,
    thousands,
)

__all__ = ["render_markdown", "render_headline", "GOAL_VS_SORTED", "RECOMPOSITION_TARGET"]


def _headline(r: dict) -> list[str]:
    pad = r["padding"]["batchings"]["B32"]
    auto_k = pad["auto"]["k"]
    recomp = {x["name"]: x for x in r["quality"]["recomposition"]["B32"]["rows"]}
    tr = r.get("training", {}).get("policies", {})
    rows = []
    for p in pad["policies"]:
        name = p["name"]
        if name in ("optimal:6", "optimal:16"):
            continue  # in section 1; the headline keeps one row per idea
        t = tr.get(name)
        train = "not trained" if t is None else f"{t['vs_sorted']:.2f}"
        if t is not None and name == "optimal:auto":
            train += f" (K={t['num_buckets']})"
        rc = recomp.get(name)
        rows.append(
            [
                f"**{policy_name(name, auto_k)}**"
                if name == "optimal:auto"
                else policy_name(name, auto_k),
                f"{p['vs_sorted']:.3f}",
                train,
                f"{TEAM_MEASURED[name]:.3f}"
                if name in TEAM_MEASURED
                else ("1.000" if name == "sorted" else ""),
                pct(rc["recomposition"]) if rc else "n/a",
                pct(rc["repeated_pairs"], 3) if rc else "n/a",
            ]
        )
    return table(
        [
            "policy",
            f"padding eff. vs sorted ({thousands(r['padding']['samples'])}, B=32)",
            "train real tok/s vs sorted (CPU)",
            "team measured tok/s vs sorted",
            "recomposition e0→e1 (B=32)",
            "repeated pairs (B=32)",
        ],
        rows,
    )


def _verdicts(r: dict) -> list[str]:
    out = []
    tr = r.get("training", {}).get("policies", {})
    if "optimal:auto" in tr:
        v = tr["optimal:auto"]["vs_sorted"]
        met = "met" if v >= GOAL_VS_SORTED else "not met"
        out.append(
            f"- Throughput goal (bucketed >= {GOAL_VS_SORTED} of sorted-static): **{met}** — "
            f"{v:.2f} in training on CPU (median of {plural(r['training']['repeats'], 'round')}), "
            f"{by_name(r['padding']['batchings']['B32']['policies'])['optimal:auto']['vs_sorted']:.3f}"
            " in simulated "
            f"padding on the {r['padding']['samples']:,}-sample preset."
        )
        out.append(_steps_note(r))
    rows = {x["name"]: x for x in r["quality"]["recomposition"]["B32"]["rows"]}
    ours, rnd = rows.get("optimal:auto"), rows.get("random")
    if ours and rnd:
        met = "met" if ours["recomposition"] < RECOMPOSITION_TARGET else "not met"
        out.append(
            f"- Recomposition target (< {pct(RECOMPOSITION_TARGET, 0)} of micro-batches repeating "
            f"a pair): **{met}** — {pct(ours['recomposition'])} for the auto edges at B=32, "
            f"against a chance floor of {pct(ours['chance_floor'])} for those bucket sizes; even "
            f"a full random shuffle measures {pct(rnd['recomposition'])} (floor "
            f"{pct(rnd['chance_floor'])}). Pair-level, {pct(ours['repeated_pairs'], 3)} of "
            f"sample pairs meet again (sorted-static: {pct(rows['sorted']['repeated_pairs'], 0)})."
        )
    out += _realtext_verdict(r)
    return out + [""]


def _realtext_verdict(r: dict) -> list[str]:
    """Loss readability on synthetic and on real text, for the headline."""
    tr = r.get("training", {})
    rt, syn = tr.get("realtext"), tr.get("readability", {}).get("optimal:auto")
    if not rt:
        return []
    x = rt["readability"]
    met = "met" if x["ratio"] <= READABILITY_GOAL else "not met"
    lo, hi = rt["bucket_mean_loss_span"] or (float("nan"), float("nan"))
    corr = rt["bucket_loss_corr"]
    return [
        f"- Loss readability on real text (goal: var of step-to-step change, debiased / raw <= "
        f"{READABILITY_GOAL}): **{met}** — {x['ratio']:.2f} on the Python "
        f"{rt['corpus']['python']} standard library ({rt['corpus']['samples']:,} functions, byte "
        f"tokens, {rt['num_buckets']} buckets, {rt['steps']} steps), where per-bucket mean loss "
        f"spans {lo:.2f}-{hi:.2f} nats (correlation with the bucket "
        f"{'n/a' if corr is None else f'{corr:.2f}'}); "
        + (
            f"{syn['ratio']:.2f} on the synthetic corpus, whose buckets have no loss offset."
            if syn
            else ""
        )
    ]


def _steps_note(r: dict) -> str:
    """Why training can trail padding for many buckets at reduced scale: more, partial steps."""
    tr = r["training"]["policies"]
    ours, srt = tr["optimal:auto"], tr["sorted"]
    pad = by_name(r["padding"]["batchings"]["B32"]["policies"])
    full = pad["optimal:auto"]["micro_batches"] / pad["sorted"]["micro_batches"] - 1
    return (
        f"  At this reduced scale the auto edges' padding is {ours['padding_efficiency'] / srt['padding_efficiency']:.3f} "
        f"of sorted, but they run {ours['steps']} steps to sorted's {srt['steps']} "
        f"({100 * (ours['steps'] / srt['steps'] - 1):+.0f}%): each of the {ours['num_buckets']} "
        f"buckets ends in a partial batch, and every step pays a fixed cost. On the "
        f"{r['padding']['samples']:,}-sample preset the same effect is {100 * full:+.2f}% steps."
    )


def _section_padding(r: dict) -> list[str]:
    pad = r["padding"]
    out = [
        "## 1. Padding and planning",
        "",
        f"Simulated on the seed-calibrated preset ({pad['samples']:,} samples, {pad['tokens']:,} "
        "tokens; `bench.policies.compare_policies`, the simulator behind `jobs.plan_buckets`). "
        "Efficiency = real tokens / padded slots, each micro-batch padded to its longest sample "
        "rounded up to 8; one rank, so a global batch is one micro-batch. Under a token budget "
        "sorted and random are cut greedily to the budget like the bucketed plans (`batching.fill: "
        "greedy`), megabatch uses one fixed batch sized for the longest sample (budget // 8192). "
        "Deterministic: no repeats needed.",
        "",
    ]
    blocks = pad["batchings"]
    header = ["policy"]
    for b in blocks.values():
        lab = (
            f"micro-batch {b['batching']['batch_size']}"
            if b["batching"]["mode"] == "fixed"
            else f"token budget {b['batching']['token_budget']:,}"
        )
        header += [f"efficiency ({lab})", "vs sorted"]
    first = next(iter(blocks.values()))
    rows = []
    for p in first["policies"]:
        row = [p["label"] if p["name"] != "optimal:auto" else "optimal edges, auto"]
        for b in blocks.values():
            q = by_name(b["policies"])[p["name"]]
            k = f" (K={b['auto']['k']})" if q["name"] == "optimal:auto" else ""
            row += [f"{q['efficiency']:.4f}{k}", f"{q['vs_sorted']:.3f}"]
        rows.append(row)
    out += table(header, rows)
    auto = first["auto"]
    out += [
        f"`auto` is the smallest K whose simulated efficiency reaches the target "
        f"{auto['target']} (`buckets.num_buckets: auto`). Team's edges: "
        f"`{next(p['edges'] for p in first['policies'] if p['name'] == 'edges:team')}`.",
        "",
    ]
    c = pad["costs"]
    out += [
        f"Planning cost (median of {plural(c['repeats'], 'run')}): exact-DP edges for K={c['k']} "
        f"(`buckets.optimize`) and one bucketed epoch plan (`plan.epoch_plan`, token budget "
        f"{c['batching']['token_budget']:,}, {c['world_size']} ranks).",
        "",
    ]
    sizes = c["sizes"]
    rows = [
        [
            f"{s['samples']:,}",
            f"{s['tokens'] / 1e6:,.0f} M",
            f"{s['optimize_s']:.3f}",
            f"{s['plan_s']:.3f}",
            f"{s['steps']:,}",
        ]
        for s in sizes.values()
    ]
    out += table(["samples", "tokens", "optimize K=32 (s)", "epoch plan (s)", "steps"], rows)
    if "scaled" in sizes:
        a, b = sizes["preset"], sizes["scaled"]
        n = b["samples"] / a["samples"]
        out += [
            f"At {n:.0f}x the samples the optimizer takes {b['optimize_s'] / a['optimize_s']:.1f}x "
            f"as long (it works on the histogram of at most 8192 distinct lengths, so beyond "
            f"building the histogram its cost does not grow with the data) and the plan "
            f"{b['plan_s'] / a['plan_s']:.1f}x (linear sorts and gathers over samples).",
            "",
        ]
    return out


def _chapter_row(c: dict) -> list[str]:
    rss = rss_pair(c) if "feeder_peak_rss_bytes" in c else "not measured"
    return [
        f"{c['num_samples']:,}",
        "whole epoch" if c["chapter_tokens"] is None else f"{c['chapter_tokens']:,}",
        f"{c['chapters']}",
        f"{c['first_step_s']:.1f}",
        f"{c['epoch_s']:.1f}",
        f"{c['peak_object_store_bytes'] / 1e6:,.0f}",
        f"{c.get('spilled_bytes', 0) / 1e6:,.0f}",
        f"{c['feeder_peak_held_bytes'] / 1e6:,.0f}",
        rss,
    ]


def chapter_growth(chapters: list[dict]) -> list[str]:
    """The whole epoch's object-store peak from the smallest corpus measured to the largest, as
    a ratio next to the tokens'; and at each corpus size, the chapters' peak against it."""

    def mb(c: dict) -> str:
        spilled = c.get("spilled_bytes", 0)
        tail = f" ({spilled / 1e6:,.0f} MB spilled)" if spilled else ""
        return f"{c['peak_object_store_bytes'] / 1e6:,.0f} MB{tail}"

    whole = {c["num_samples"]: c for c in chapters if c["chapter_tokens"] is None}
    out = []
    if len(whole) >= 2:
        a, b = whole[min(whole)], whole[max(whole)]
        if a["peak_object_store_bytes"] > 0:
            out.append(
                f"Whole epoch: from {a['num_samples']:,} to {b['num_samples']:,} samples "
                f"({b['num_tokens'] / a['num_tokens']:.1f}x the tokens) the object-store peak "
                f"grew {b['peak_object_store_bytes'] / a['peak_object_store_bytes']:.1f}x, to "
                f"{mb(b)}."
            )
    for c in chapters:
        w = whole.get(c["num_samples"])
        if c["chapter_tokens"] is None or w is None or w["peak_object_store_bytes"] <= 0:
            continue
        out.append(
            f"At {c['num_samples']:,} samples, chapters of {c['chapter_tokens']:,} tokens "
            f"peaked at {mb(c)}, {c['peak_object_store_bytes'] / w['peak_object_store_bytes']:.2f}"
            " of the whole epoch's."
        )
    return out + ([""] if out else [])


def whole_epoch_not_run(chapters: list[dict], first_steps: list[dict]) -> list[str]:
    """Where the first-step runs reach a larger corpus than any whole epoch measured: why the
    whole epoch was not run there, from that corpus's tokens."""
    whole = [c["num_samples"] for c in chapters if c["chapter_tokens"] is None]
    bigger = [x for x in first_steps if whole and x["num_samples"] > max(whole)]
    if not bigger:
        return []
    x = max(bigger, key=lambda x: x["num_samples"])
    return [
        f"The whole epoch was not run at {x['num_samples']:,} samples: that epoch and the next, "
        f"prefetched, would hold up to {2 * 4 * x['num_tokens'] / 1e9:,.1f} GB of int32 token "
        "ids in the object store at once; it is left out to keep `make bench` within the "
        "machine's memory.",
        "",
    ]


def _prepare_cell(x: dict) -> str:
    """The epoch's preparation: the first epoch's and the median of the later ones where the
    row cache was on (the first fills it); else the median with its parts."""
    if x.get("row_cache"):
        later = x.get("prepare_later_s")
        return f"{x['prepare_first_s']:.1f} / " + ("-" if later is None else f"{later:.1f}")
    return (
        f"{x['prepare_wall_s']:.1f} (plan {x['plan_s']:.2f}, sort {x['sort_s']:.1f}, "
        f"split {x['split_s']:.2f})"
    )


def _section_delivery(r: dict) -> list[str]:
    d = r["delivery"]
    out = ["## 4. Pipeline delivery", ""]
    if "skipped" in d:
        return out + [f"Skipped: {d['skipped']}.", ""]
    out += [
        "`bench.delivery.measure_delivery` (as `python -m jobs.bench_data`): the Ray path "
        "training uses (length index, edges, the feeder's plan-keyed sort and split), consumed "
        "by 2 Ray tasks padding micro-batches to torch tensors, against a one-process "
        "pyarrow+numpy baseline doing the same gathering and padding. Medians over epochs. "
        "Epoch preparation: with the row cache (delivery.row_cache), the first epoch's, which "
        "decodes every row group once into it, / the median of the later epochs', which copy "
        "their rows out of it.",
        "",
    ]
    rows = []
    for x in d["runs"].values():
        rows.append(
            [
                f"{x['num_samples']:,}",
                f"{x['num_tokens'] / 1e6:,.0f} M",
                f"{x['repeats']}",
                f"{x['ray_tokens_per_s_per_consumer'] / 1e6:.1f}",
                f"{x['ray_tokens_per_s_total'] / 1e6:.1f}",
                f"{x['baseline_tokens_per_s'] / 1e6:.1f}",
                _prepare_cell(x),
                f"{x['index_s']:.1f} / {x['index_cached_s']:.2f}",
                "cached" if x["generate_s"] == 0 else f"{x['generate_s']:.0f}",
            ]
        )
    out += table(
        [
            "samples",
            "tokens",
            "epochs",
            "real Mtok/s per consumer",
            "total",
            "1-process baseline",
            "epoch preparation (s): first / later with the row cache",
            "length index cold / cached (s)",
            "corpus generation (s)",
        ],
        rows,
    )
    chapters = [
        c | {"num_samples": x["num_samples"]}
        for x in d["runs"].values()
        for c in x.get("chapters", [])
    ] + d.get("chapters", [])
    if chapters:
        out += [
            "",
            "Chapters (`bench.delivery.measure_chapters`): one cold epoch as training "
            "runs it (feeder prefetching, consumers asking at once), whole and in chapters, each "
            "on an empty row cache (the first chapter fills it). The "
            "object store peak is above its level before the feeder started; spilled: bytes Ray "
            "spilled to disk during the epoch.",
            "",
        ]
        out += table(
            [
                "samples",
                "chapter tokens",
                "chapters",
                "first micro-batch (s)",
                "epoch (s)",
                "object store peak (MB)",
                "spilled (MB)",
                "feeder parts held, peak (MB)",
                "RSS peak feeder (private) / driver (MB)",
            ],
            [_chapter_row(c) for c in chapters],
        )
        out += (
            [""]
            + chapter_growth(chapters)
            + whole_epoch_not_run(chapters, d.get("first_steps", []))
        )
    return out + section_first_steps(d.get("first_steps", []))


def _section_run(r: dict) -> list[str]:
    m = r["meta"]
    o = m["options"]
    reduced = []
    if o["quick"]:
        reduced.append(
            "`--quick`: every section at smoke scale (small presets, one round); not for "
            "comparison with the team's numbers"
        )
    if o["samples"] != 902_087:
        reduced.append(f"sections 1 and 3 on {o['samples']:,} samples instead of 902,087")
    if o["training"]:
        reduced.append(
            f"section 2 on {o['train_samples']:,} samples with lengths scaled to max "
            f"{o['train_max_length']} (see section 2), {plural(o['train_repeats'], 'round')}"
        )
    if o["delivery"] and 902_087 not in o["delivery_samples"]:
        reduced.append(
            "section 4 at "
            + ", ".join(f"{n:,}" for n in o["delivery_samples"])
            + " samples only; the 902K run (a ~1 GB corpus) is `--full`"
        )
    out = ["## What ran, what was reduced or skipped", ""]
    out += [f"- {x}" for x in reduced + m["skipped"]]
    out += [
        f"- load average (1/5/15 min) before {m['load_before']}, after {m.get('load_after')}: "
        "other engineers' jobs share this machine, so timings are noisy; ratios are taken "
        "within a round and medians reported.",
        f"- whole run: {m.get('duration_s', 0) / 60:.1f} min.",
        "",
    ]
    return out


def render_headline(results: dict, *, doc_path: str = "BENCHMARKS.md") -> str:
    """The headline table and verdicts alone, for the README (links resolve from the repo root)."""
    m = results["meta"]
    out = [
        f"Measured by `{m['command']}` on {m['date_utc']} "
        f"({m['machine']['cores']} CPU cores, no GPU unless stated); details, method and plots "
        f"in [{doc_path}]({doc_path}).",
        "",
    ]
    return "\n".join(out + _headline(results) + _verdicts(results))


def render_markdown(
    results: dict, *, doc_path: str = "BENCHMARKS.md", json_path: str | None = None
) -> str:
    """The whole document; image links are relative to `doc_path`'s folder."""
    unfinished = {"skipped": "not finished: the run stopped before this section ended"}
    results = {"training": unfinished, "delivery": unfinished, "gpu": unfinished} | results
    m = results["meta"]
    mc = m["machine"]
    plots = {Path(p).stem: p for p in results.get("plots", [])}
    out = [
        "# Benchmarks",
        "",
        f"Generated by `{m['command']}` on {m['date_utc']} (git {mc['git_commit']}"
        f"{', with uncommitted changes' if mc['git_dirty'] else ''}). Nothing below is typed by "
        "hand: every figure comes from "
        + (
            f"[`{rel_link(json_path, doc_path)}`]({rel_link(json_path, doc_path)})"
            if json_path
            else "the run"
        )
        + ".",
        "",
        f"Machine: {mc['cpu']}, {mc['cores']} cores, {mc['ram_gib']} GiB RAM, "
        f"GPU: {mc['gpu'] or 'none'}; Python {mc['python']}, torch {mc['torch']}, Ray {mc['ray']}, "
        f"numpy {mc['numpy']}, pyarrow {mc['pyarrow']}.",
        "",
        "## Headline",
        "",
    ]
    out += _headline(results)
    out += [
        f"Padding and recomposition: the {results['padding']['samples']:,}-sample preset, "
        "micro-batch 32 (sections 1 and 3). "
        "Training: the tiny model on 2 CPU workers at reduced scale (section 2); its optimal "
        "edges come from `auto` on that smaller corpus, hence a different K. Team measured: "
        "the team's own run ("
        + ", ".join(f"{policy_name(k)} {v:g} Ktok/s" for k, v in TEAM_KTOK_S.items())
        + " on their 902,087-sample run).",
        "",
    ]
    out += _verdicts(results)
    if "padding" in plots:
        out += [f"![padding]({rel_link(plots['padding'], doc_path)})", ""]
    out += _section_padding(results)
    out += render_budget(results)
    out += section_training(results, doc_path, plots)
    out += section_quality(results, doc_path, plots)
    out += section_packed(results)
    out += _section_delivery(results)
    out += _section_run(results)
    return "\n".join(out)
