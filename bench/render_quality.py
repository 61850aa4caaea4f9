"""Section 3 of BENCHMARKS.md: training-signal quality (batch recomposition, loss-curve
readability, the real-text run)."""

from __future__ import annotations

from bench.render_util import num, pct, policy_name, rel_link, table

__all__ = ["section_quality"]


def section_quality(r: dict, doc: str, plots: dict) -> list[str]:
    """Section 3: batch recomposition, loss-curve readability and the real-text run."""
    q = r["quality"]
    out = [
        "## 3. Training-signal quality (why sorted looked smooth)",
        "",
        "**Batch recomposition**: the share of epoch-1 micro-batches holding a pair of samples "
        "that already shared a micro-batch in epoch 0 (`metrics.batch_recomposition`, on the "
        "planner's own epochs 0 and 1, "
        f"{q['samples']:,}-sample preset). A fresh shuffle re-pairs some samples by "
        "chance: a batch of B holds B(B-1)/2 pairs, each of which met last epoch with "
        "probability ~(B-1)/(n-1) in a pool of n, so the *chance floor* is "
        "1 - exp(-B(B-1)/2 x (B-1)/(n-1)), computed for each plan's own batch and bucket sizes. "
        "*Repeated pairs* is the pair-level share. Narrower buckets (larger K) mean smaller pools "
        "and a higher floor: padding and recomposition trade against each other through K.",
        "",
    ]
    out += _recomposition_tables(q["recomposition"])
    out += [
        "Megabatch's floor is not computed (its batches are length-sorted windows, not a shuffle "
        "of a fixed pool). The switch rate is the share of consecutive steps from different "
        "buckets in epoch 1; the expected value 1 - sum p_k^2 is what independent draws with "
        "the same bucket frequencies give (`metrics.switch_rate`).",
        "",
    ]
    if "recomposition" in plots:
        out += [f"![recomposition]({rel_link(plots['recomposition'], doc)})", ""]
    tr = r.get("training", {})
    out += _readability(tr, doc, plots)
    out += _realtext_section(tr, doc, plots)
    return out


def _recomposition_tables(recomposition: dict) -> list[str]:
    """One table per batching: recomposition, its chance floor, repeated pairs, switch rates."""
    out: list[str] = []
    for block in recomposition.values():
        rows = [
            [
                policy_name(x["name"], block["auto_k"]),
                num(x["mean_batch"], ".1f"),
                pct(x["recomposition"]),
                pct(x["chance_floor"]),
                pct(x["repeated_pairs"], 3),
                pct(x["switch_rate"]),
                pct(x["switch_rate_expected"]),
            ]
            for x in block["rows"]
        ]
        out += [f"At {block['label']}:", ""]
        out += table(
            [
                "policy",
                "mean batch",
                "recomposition",
                "chance floor",
                "repeated pairs",
                "bucket switch rate",
                "expected (independent draws)",
            ],
            rows,
        )
    return out


def _readability(tr: dict, doc: str, plots: dict) -> list[str]:
    """Loss-curve readability: raw against bucket-debiased loss, step to step."""
    if "readability" not in tr:
        return []
    rows = [
        [
            policy_name(n, tr["policies"][n]["num_buckets"]),
            f"{x['steps']} (first {x['skipped']} left out)",
            f"{x['diff_var_raw']:.5f}",
            f"{x['diff_var_debiased']:.5f}",
            f"{x['ratio']:.2f}",
        ]
        for n, x in tr["readability"].items()
    ]
    out = [
        "**Loss-curve readability**: variance of the step-to-step change of `train/loss` and "
        "of `train/loss_debiased` over the same steps of section 2's first-round run "
        "(logged every step). A ratio below 1 means the debiased curve is smoother.",
        "",
    ]
    out += table(["run", "steps", "var Δ loss", "var Δ debiased", "debiased / raw"], rows)
    noisier = [n for n, x in tr["readability"].items() if x["ratio"] > 1]
    if noisier:
        x = tr["readability"][noisier[0]]
        out += [
            f"Where the ratio is above 1 ({', '.join(policy_name(n) for n in noisier)}), the "
            "debiased curve is *noisier* than the raw one. The synthetic tokens are equally "
            "predictable at every length, so the buckets have almost no loss offset to "
            "remove, and in a run this short (a bucket is visited about "
            f"{x.get('visits_per_bucket', 0):.0f} times while the loss is still falling) "
            "the offsets estimated from a few steps add their own noise. "
            "`BucketLossTracker` fits one length trend shared by all buckets over the last "
            f"{x.get('tracker_window', 24)} steps and shrinks each bucket's own deviation "
            "towards 0 for this reason; on data whose buckets do differ in loss "
            "(tests/unit/test_metrics.py: offsets spanning 1.3 nats) the debiased curve's "
            "step-to-step variance is more than 20x below the raw one.",
            "",
        ]
    if "loss" in plots:
        out += [f"![loss curves]({rel_link(plots['loss'], doc)})", ""]
    return out


def _realtext_section(tr: dict, doc: str, plots: dict) -> list[str]:
    rt = tr.get("realtext")
    if not rt:
        return []
    x = rt["readability"]
    out = [
        f"**Real text** (`bench.realtext`): the same model on the Python "
        f"{rt['corpus']['python']} standard library split into functions "
        f"({rt['corpus']['samples']:,} samples, byte tokens, max length {rt['max_length']}, "
        f"token budget {rt['token_budget']:,}), {rt['num_buckets']} optimal buckets, "
        f"{rt['steps']} steps logged every step.",
        "",
    ]
    out += table(
        ["run", "steps", "var Δ loss", "var Δ debiased", "debiased / raw"],
        [
            [
                f"real text ({rt['num_buckets']} buckets)",
                f"{x['steps']} (first {x['skipped']} left out)",
                f"{x['diff_var_raw']:.5f}",
                f"{x['diff_var_debiased']:.5f}",
                f"{x['ratio']:.2f}",
            ]
        ],
    )
    if "realtext_bucket_loss" in plots:
        out += [
            "Each bucket's points are its own step losses, drawn only at the steps that trained "
            "it: the jumpy raw curve (grey) decomposes into per-bucket curves.",
            "",
            f"![per-bucket loss on real text]({rel_link(plots['realtext_bucket_loss'], doc)})",
            "",
        ]
    return out
