"""The "Packed rows" section of BENCHMARKS.md, from `bench.packed_training`'s results."""

from __future__ import annotations

from bench.packing import render as render_paper
from bench.render_util import num, plural, table

__all__ = ["GOAL_PACK_S", "GOAL_VS_SORTED_PACKED", "section_packed"]

# The goals the packed mode was built against: CPU real tokens/s at least sorted-static's in the
# same run, and an epoch of the 902K preset packed in at most 2 seconds.
GOAL_VS_SORTED_PACKED = 1.00
GOAL_PACK_S = 2.0
_LABELS = {
    "packed": "packed rows, full shuffle",
    "sorted": "padded, sorted-static",
    "auto": "padded, bucketed (auto edges)",
}


def _load(pair) -> str:
    return " -> ".join("n/a" if x is None else f"{x:.1f}" for x in pair)


def section_packed(r: dict) -> list[str]:
    """Same-run training, the step kernel and the on-paper table, with how and where they ran."""
    out = ["## Packed rows (`batching.mode: packed`)", ""]
    p = r.get("packed")
    if p is None:
        return out + ["Not measured in this run.", ""]
    if "skipped" in p:
        return out + [f"Skipped: {p['skipped']}.", ""]
    m, mc = r["meta"], r["meta"]["machine"]
    out += [
        f"Measured by `{p.get('command', m['command'])}` on {p.get('date_utc', m['date_utc'])}: "
        f"{mc['cpu']}, {mc['cores']} cores, "
        f"GPU: {mc['gpu'] or 'none'}; 1-minute load average {_load([p['load_before'], p['load_after']])} "
        "over this section (a shared machine is slower in absolute terms; the ratios compare "
        "runs of the same section).",
        "",
    ]
    out += _training(p["training"])
    if "plan_kernel" in p:
        out += _plan_kernel(p["plan_kernel"])
    out += _kernel(p["kernel"])
    out += _paper(p["paper"])
    return out


def _training(t: dict) -> list[str]:
    v = t["variants"]
    mdl = t["model"]
    out = [
        "### Same-run CPU training",
        "",
        f"`pipeline.train.launch.run` on one private local Ray cluster, `{t['config']}` (the "
        f"demo: the tiny decoder, {mdl['n_layers']} layers, d_model {mdl['d_model']}, on real "
        f"text, the stdlib corpus, {t['num_samples']:,} samples, `data.max_length="
        f"{t['max_length']}`, 2 CPU workers), one whole epoch per variant and "
        f"{plural(t['repeats'], 'round')} (order rotated). Padded variants pay "
        f"{t['token_budget']:,} tokens per step; packed rows of {t['row_tokens']} tokens, "
        f"{t['token_budget'] // t['row_tokens']} per step, pay the same. Real tokens/s: the "
        f"median over steps of each step's real tokens / step time, leaving out the first "
        f"{t['warmup_steps_excluded']} steps; the ratio to sorted-static is taken within each "
        "round. Loss readability: the variance of the step-to-step change of the loss over the "
        "last three quarters of the run (smaller: a smoother curve); with one bucket (packed, "
        "sorted-static) the debiased loss has no bucket offset to remove.",
        "",
    ]
    rows = []
    for name, x in v.items():
        rows.append(
            [
                _LABELS.get(name, name),
                f"{x['median_real_tokens_per_s'] / 1e3:.2f}",
                f"{x['vs_sorted']:.3f}",
                str(x["steps"]),
                f"{x['padding_efficiency']:.3f}",
                num(x["diff_var_raw"], ".4f"),
                num(x["diff_var_debiased"], ".4f"),
                ", ".join(_load(ld) for ld in x["load1_all"]),
            ]
        )
    out += table(
        [
            "batches",
            "real Ktok/s (median)",
            "vs sorted-static",
            "steps",
            "token efficiency",
            "var Δ raw loss",
            "var Δ debiased loss",
            "load average (before -> after)",
        ],
        rows,
    )
    if "packed" in v:
        ratio = v["packed"]["vs_sorted"]
        rounds = _rounds(v["packed"])
        met = "met" if ratio >= GOAL_VS_SORTED_PACKED else "not met"
        if len(rounds) > 1 and min(rounds) < GOAL_VS_SORTED_PACKED <= max(rounds):
            met += (
                f" by the median, the rounds on both sides of it ({min(rounds):.2f}x-"
                f"{max(rounds):.2f}x)"
            )
        out += [
            f"Packed rows train at {ratio:.2f}x sorted-static's real tokens/s in this run (goal "
            f">= {GOAL_VS_SORTED_PACKED:.2f}x: {met}); {_ahead(v)}.",
            "",
        ]
    return out


def _rounds(x: dict) -> list[float]:
    """A variant's ratio to sorted-static in each round (results without them: the median)."""
    return x.get("vs_sorted_all") or [x["vs_sorted"]]


def _ahead(v: dict) -> str:
    """Which variant is ahead on CPU: named only when it is the fastest in every round (each
    round's ratios to sorted-static compare the variants of that round)."""
    names = list(v)
    rounds = {n: _rounds(v[n]) for n in names}
    per_round = [
        max(names, key=lambda n, i=i: rounds[n][i]) for i in range(min(map(len, rounds.values())))
    ]
    if per_round and len(set(per_round)) == 1:
        rounds = "" if len(per_round) == 1 else f" (the fastest in all {len(per_round)} rounds)"
        return f"ahead on CPU here: {_LABELS.get(per_round[0], per_round[0])}{rounds}"
    fastest = "; ".join(_LABELS.get(n, n) for n in per_round)
    return f"no variant is ahead in every round on CPU here (the fastest by round: {fastest})"


def _plan_kernel(k: dict) -> list[str]:
    v = k["variants"]
    rows = [
        [
            _LABELS.get(n, n),
            str(x["micro_batches"]),
            f"{x['real_tokens']:,}",
            f"{x['token_efficiency']:.3f}",
            f"{x['seconds']:.1f}",
            f"{x['real_tokens_per_s'] / 1e3:.2f}",
            f"{x['vs_sorted']:.3f}",
            f"{min(x['vs_sorted_blocks']):.2f}-{max(x['vs_sorted_blocks']):.2f}",
        ]
        for n, x in v.items()
    ]
    out = [
        "### The training plans' compute",
        "",
        f"Forward + backward + the training loss of the same model, one thread, on the "
        f"micro-batches the runs above feed rank {k['rank']} of {k['world_size']} in epoch 0 "
        f"(each variant's own plan over the same {k['samples']:,} samples, {_every(k['every'])}, "
        "token ids drawn at random: compute does not depend on them), the variants taking "
        "turns micro-batch by micro-batch, so a slow phase of the machine falls on all of them; "
        f"load average {_load(k['load1'])}. Each variant's "
        f"micro-batches split into {k['blocks']} strided subsets give the range of the ratio.",
        "",
        *table(
            [
                "batches",
                "micro-batches",
                "real tokens",
                "token efficiency",
                "seconds",
                "real Ktok/s",
                "vs sorted-static",
                "subsets",
            ],
            rows,
        ),
    ]
    if "packed" in v:
        out += [
            f"Per real token, packed rows computed at {v['packed']['vs_sorted']:.3f}x "
            "sorted-static's rate on the same corpus.",
            "",
        ]
    return out


def _every(n: int) -> str:
    if n <= 2:
        return "every micro-batch" if n == 1 else "every second micro-batch"
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"every {n}{suffix} micro-batch"


def _kernel(k: dict) -> list[str]:
    s, tps = k["seconds"], k["real_tokens_per_s"]
    names = {
        "padded": "padded, sorted micro-batches",
        "packed": "packed rows, per-document attention (grouped)",
        "packed_block_mask": "packed rows, block-diagonal mask (reference)",
    }
    rows = [
        [names[n], f"{s[n]:.3f}", f"{tps[n] / 1e3:.2f}", f"{s['padded'] / s[n]:.2f}"] for n in names
    ]
    return [
        "### The step kernel",
        "",
        f"Forward + backward of the same model on the same {k['documents']} documents "
        f"({k['real_tokens']:,} real tokens, the preset's lengths scaled to "
        f"{k.get('max_length', k['row_tokens'])}), one thread, micro-batches of at most "
        f"{k['micro_batch_slots']:,} token slots: {k['packed_rows']} packed rows of "
        f"{k['row_tokens']:,} tokens ({k['packed_slots']:,} slots) against "
        f"{k['padded_batches']} padded batches ({k['padded_slots']:,} slots); median of "
        f"{k['repeats']} after a warm-up, variants interleaved; load average {_load(k['load1'])}"
        + (
            "; freed memory kept for reuse as in a training worker (`keep_freed_memory`)."
            if k.get("keep_freed_memory")
            else "."
        ),
        "",
        *table(["batches", "seconds", "real Ktok/s", "speed vs padded"], rows),
    ]


def _paper(t: dict) -> list[str]:
    met = "met" if t["pack_epoch_s"] <= GOAL_PACK_S else "not met"
    return [
        "### On paper (the preset)",
        "",
        f"`bench.packing` on {t['samples']:,} samples: cost model width "
        f"{t['attention_width']:,}, padded batches greedy to {t['budget']:,} tokens per step "
        f"against {t['rows_per_step']} rows of {t['row_tokens']:,} tokens, columns at 1 and 8 "
        "ranks.",
        "",
        render_paper(t),
        "",
        f"Goal: packing an epoch in <= {GOAL_PACK_S:g} s: {met}.",
        "",
    ]
