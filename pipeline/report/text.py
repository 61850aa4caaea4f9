"""The bucket report (`build.build_report`, `build.packed_report`) as readable plain text."""

from __future__ import annotations

__all__ = ["packed_line", "render_text", "truncation_line"]


def truncation_line(t: dict) -> str:
    """One line on what truncation at the top edge cuts (`pipeline.core.metrics.truncation_counts`
    plus the `top` it cut at); the lengths above are after the cut."""
    share = t["truncated_tokens"] / t["tokens"] if t["tokens"] else 0.0
    return (
        f"truncated at {t['top']}: {t['truncated_samples']:,} samples, "
        f"{t['truncated_tokens']:,} tokens ({share:.1%} of {t['tokens']:,})"
    )


def render_text(report: dict) -> str:
    """The report as a readable plain-text table."""
    L, b, ch = report["lengths"], report["batching"], report["chosen"]
    out = []
    out.append(
        f"samples {L['samples']:,}  tokens {L['tokens']:,}  length min {L['min']} p50 {L['p50']:.0f} "
        f"p90 {L['p90']:.0f} p99 {L['p99']:.0f} max {L['max']} mean {L['mean']:.0f}"
    )
    if "truncation" in report:
        out.append(truncation_line(report["truncation"]))
    if b["mode"] == "fixed":
        sizing = f"fixed batch {b['batch_size']} (global)"
    elif b.get("fill") == "greedy":
        sizing = (
            f"token budget {b['token_budget']:,} per global step, batches filled greedily "
            f"(sorted/random: cut greedily to the same budget, as fairseq's batch_by_size; "
            f"megabatch: fixed batch {b['non_bucketed_batch_size']} = budget // max length)"
        )
    else:
        sizing = (
            f"token budget {b['token_budget']:,} per global step (non-bucketed policies: fixed batch "
            f"{b['non_bucketed_batch_size']} = budget // max length)"
        )
    out.append(
        f"batching: {sizing}; pad_to_multiple_of {b['pad_to_multiple_of']}; world size "
        f"{report['world_size']}; seed {report['seed']} epoch {report['epoch']}"
    )
    src = {"given": "given", "optimal": "optimal (exact DP)", "auto": "auto"}[ch["source"]]
    out.append(f"\nedges ({src}, K={ch['num_buckets']}): {ch['edges']}")
    if "auto" in ch:
        a = ch["auto"]
        below = "" if a["below"] is None else f"; K={a['k'] - 1}: {a['below']:.4f}"
        verdict = "reached" if a["reached"] else "NOT reached (max K used)"
        out.append(
            f"auto: target {a['target']} {verdict} at K={a['k']} ({a['efficiency']:.4f}{below})"
        )
    out.append("\nper bucket (padding every sample to its bucket's upper edge):")
    hdr = f"{'bucket':>6} {'range':>13} {'samples':>9} {'tokens':>13} {'steps':>7} {'global B':>8} {'micro B':>7} {'eff@upper':>9}"
    out.append(hdr)
    for r in report["buckets"]:
        rng = f"({r['lower']},{r['upper']}]"
        out.append(
            f"{r['bucket']:>6} {rng:>13} {r['samples']:>9,} {r['tokens']:>13,} {r['steps']:>7,} "
            f"{r['global_batch']:>8} {r['micro_batch']:>7} {r['upper_efficiency']:>9.3f}"
        )
    u = report["to_upper_edge"]
    out.append(
        f"to-upper-edge padding: {u['padded_tokens']:,} padded tokens for {u['real_tokens']:,} real "
        f"({u['padding_tokens']:,} padding, efficiency {u['efficiency']:.4f})"
    )
    out.append("\npadding efficiency per policy (real / padded slots, batch-max padding):")
    out.append(
        f"{'policy':<16} {'efficiency':>10} {'vs sorted':>9} {'vs random':>9} {'micro-batches':>13} "
        f"{'steps':>8} {'steps/sorted':>12} {'fill':>6} {'over budget':>11}"
    )
    for p in report["policies"]:
        mark = "  <- chosen" if p["name"] == ch["name"] else ""
        fill = "" if p.get("fill") is None else f"{p['fill']:.3f}"
        out.append(
            f"{p['name']:<16} {p['efficiency']:>10.4f} {p['vs_sorted']:>9.3f} {p['speedup_vs_random']:>8.2f}x "
            f"{p['micro_batches']:>13,} {p.get('steps', 0):>8,} {p.get('steps_vs_sorted', 0):>12.3f} "
            f"{fill:>6} {p.get('over_budget_steps', 0):>11,}{mark}"
        )
    if report.get("frontier"):
        out.append("\nK frontier (epoch 0): padding efficiency, steps, recomposition chance floor")
        out.append(f"{'K':>4} {'efficiency':>10} {'steps':>8} {'floor':>6}")
        for f in report["frontier"]:
            out.append(f"{f['k']:>4} {f['efficiency']:>10.4f} {f['steps']:>8,} {f['floor']:>6.3f}")
    pl, t = report["plan"], report["timings"]
    out.append(
        f"\nplan: {pl['steps']:,} steps, {pl['samples']:,} samples, {pl['dropped']} dropped, "
        f"{pl['empty_micro_batches']:,} empty micro-batches of {pl['micro_batches']:,}; hash {pl['hash']}"
    )
    out.append("timings: " + ", ".join(f"{k.removesuffix('_s')} {v:.3f}s" for k, v in t.items()))
    return "\n".join(out)


def packed_line(s: dict) -> str:
    """The packed epoch (`build.packed_report`'s summary) in one line."""
    return (
        f"packed rows: {s['rows']:,} rows in {s['steps']:,} steps, edges {s['edges']}; row fill "
        f"{s['row_fill']:.3f}, {s['docs_per_row']:.2f} documents per row; rank cost max / mean "
        f"{s['rank_max_over_mean']:.3f}, useful / paid {s['useful_over_paid']:.3f} (attention "
        f"width {s['attention_width']}); plan hash {s['hash']}"
    )
