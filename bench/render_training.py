"""Section 2 of BENCHMARKS.md: training throughput per policy, the GPU row and the token-budget
run."""

from __future__ import annotations

from bench.plots import TEAM_MEASURED
from bench.render_util import plural, policy_name, rel_link, table

__all__ = ["section_training"]


def section_training(r: dict, doc: str, plots: dict) -> list[str]:
    """Section 2: training throughput of every policy on one local Ray cluster."""
    tr = r["training"]
    out = ["## 2. Training throughput, same run", ""]
    if "skipped" in tr:
        return out + [f"Skipped: {tr['skipped']}.", ""]
    out += _training_intro(tr, r["meta"]["machine"]["cores"])
    out += _training_table(tr)
    out += _gpu_row(r.get("gpu", {}))
    out += [
        "**Why the CPU ratios track padding.** On CPU the step time of this model grows with the "
        "padded tokens it processes and every policy runs about the same number of steps, so "
        "real tokens/s relative to sorted is close to padding efficiency relative to sorted "
        "(compare the two columns); the per-step fixed cost (optimizer, DDP all-reduce, "
        "logging) pulls the ratios towards 1. On a GPU, short batches underuse the device and "
        "attention is not linear in length, so the GPU row is kept separate.",
        "",
    ]
    if "training" in plots:
        out += [f"![training throughput]({rel_link(plots['training'], doc)})", ""]
    out += _token_budget_table(tr)
    return out


def _training_intro(tr: dict, cores: int) -> list[str]:
    """What ran: the model, the scaled corpus, the rounds and the overrides."""
    b = tr["batching"]
    size = (
        f"fixed global batch {b['batch_size']}"
        if b["mode"] == "fixed"
        else f"token budget {b['token_budget']:,}"
    )
    return [
        f"`pipeline.train.launch.run` on one private local Ray cluster: the tiny model "
        f"(`{tr['config']}`: {tr['model']['n_layers']} layers, d_model {tr['model']['d_model']}, "
        f"vocabulary {tr['model']['vocab_size']}) on 2 CPU workers (0.5 CPU each), "
        f"{tr['num_samples']:,} samples x 1 epoch under every policy, {size}, the same model "
        f"and data for all. Reduced scale: CPU workers cannot train 8192-token samples, so the "
        f"corpus keeps the preset's length distribution multiplied by "
        f"{tr['max_length']}/8192 = {tr['scale']:.4g} (rounded, at least 2 tokens, "
        f"`data.max_length={tr['max_length']}`), and the team's edges are scaled by the same "
        f"factor to `{tr['team_edges_scaled']}`, so each of their buckets holds the same "
        f"samples; `pad_to_multiple_of` is 1 here, since rounding scaled lengths up to 8 "
        f"would be like rounding full-scale lengths up to {8 / tr['scale']:.0f}.",
        "",
        f"{plural(tr['repeats'], 'round')}, the policy order rotated each round; figures are medians over "
        f"rounds, and the ratio to sorted is taken within each round before the median. Real "
        f"tokens/s = real tokens / wall time of the steps, from `train.metrics_file` "
        f"(`train.log_every=1`), leaving out the first {tr['warmup_steps_excluded']} steps of "
        f"each run (allocation, longest batch first). `data/wait_fraction` is the share of that "
        f"time spent waiting for the data layer.{_load_note(tr, cores)}",
        "",
        "Policy overrides (on top of the shared `--set` list below): "
        + "; ".join(f"{p}: `{' '.join(o)}`" for p, o in tr["policy_overrides"].items()),
        "",
        "Shared overrides: `" + " ".join(tr["shared_overrides"]) + "`",
        "",
    ]


def _training_table(tr: dict) -> list[str]:
    """Per policy: K, steps, real tokens/s and the ratio to sorted, wait and padding."""
    rows = []
    for name, p in tr["policies"].items():
        rows.append(
            [
                policy_name(name, p["num_buckets"]),
                f"{p['num_buckets']}",
                f"{p['steps']}",
                f"{p['real_tokens_per_s'] / 1e3:.1f}",
                f"**{p['vs_sorted']:.2f}**",
                ", ".join(f"{x:.2f}" for x in p["vs_sorted_all"]),
                f"{p['steps_per_s']:.2f}",
                f"{p['wait_fraction']:.3f}",
                f"{p['padding_efficiency']:.3f}",
                f"{TEAM_MEASURED[name]:.3f}" if name in TEAM_MEASURED else "",
            ]
        )
    return table(
        [
            "policy",
            "K",
            "steps",
            "real Ktok/s",
            "vs sorted",
            "each round",
            "steps/s",
            "wait fraction",
            "padding eff.",
            "team measured",
        ],
        rows,
    )


def _gpu_row(gpu: dict) -> list[str]:
    """The GPU row: the bucketed smoke run's figures, or how to measure them."""
    if "skipped" in gpu:
        f = gpu.get("metrics_file", "out/gpu_smoke/metrics.jsonl")
        f = f if f.startswith("/") else f"$PWD/{f}"
        g = (
            f"not measured ({gpu['skipped']}); `scripts/gpu_smoke.sh --set "
            f"train.metrics_file={f}` on a GPU machine fills this row on the next `make bench`"
        )
    else:
        g = (
            f"bucketed run from `{gpu['metrics_file']}`: {gpu['real_tokens_per_s'] / 1e3:.1f} "
            f"real Ktok/s, {gpu['steps_per_s']:.2f} steps/s, wait fraction "
            f"{gpu['wait_fraction']:.3f}, padding {gpu['padding_efficiency']:.3f} (no sorted "
            "baseline on the GPU: ratio not measured)"
        )
    return table(["GPU row", "result"], [["bucketed on GPU (`scripts/gpu_smoke.sh`)", g]])


def _token_budget_table(tr: dict) -> list[str]:
    """The same policies under a token budget, when that run was made."""
    tb = tr.get("token_budget")
    if not tb:
        return []
    rows = [
        [
            policy_name(n, p["num_buckets"]),
            f"{p['steps']}",
            f"{p['real_tokens_per_s'] / 1e3:.1f}",
            f"{p['vs_sorted']:.2f}",
            f"{p['padding_efficiency']:.3f}",
        ]
        for n, p in tb["policies"].items()
    ]
    pol = tb["policies"]
    most = max(pol, key=lambda n: pol[n]["num_buckets"])
    ref = f" against sorted's {pol['sorted']['steps']}" if "sorted" in pol else ""
    out = [
        f"Also under a token budget of {tb['batching']['token_budget']:,} padded tokens per "
        f"step ({plural(tb['repeats'], 'round')}): every policy's global batches are cut greedily "
        "to the budget (`batching.fill: greedy`), sorted included. At this reduced scale "
        f"({tb['num_samples']:,} samples, {pol[most]['tokens']:,} tokens) an epoch is only "
        f"{pol[most]['tokens'] / tb['batching']['token_budget']:.1f} budgets, so the partial "
        "batch that ends each bucket weighs heavily: "
        f"{pol[most]['steps']} steps for the {pol[most]['num_buckets']} buckets of "
        f"{policy_name(most, pol[most]['num_buckets'])}{ref}. The ratios then mix padding with "
        "per-step overhead and are not a padding comparison; section 1b has the step counts "
        "at full scale.",
        "",
    ]
    out += table(["policy", "steps", "real Ktok/s", "vs sorted", "padding eff."], rows)
    return out


def _load_note(tr: dict, cores: int) -> str:
    loads = [
        v
        for p in tr["policies"].values()
        for pair in p.get("load1_all", [])
        if pair
        for v in pair
        if v is not None
    ]
    if not loads:
        return ""
    return (
        f" The 1-min load average around the runs ranged from {min(loads):.1f} to "
        f"{max(loads):.1f} on these {cores} cores (other engineers' jobs): a round "
        "whose ratios stand out was disturbed, which the median discards."
    )
