"""The "Packed rows" benchmark section: variants select what they claim, figures come from the
metric lines and measurements, and the section renders them with how and where they ran."""

from __future__ import annotations

import pytest

from bench.packed_training import (
    DEMO_CONFIG,
    VARIANTS,
    aggregate_variant,
    measure_step_kernel,
    run_figures,
    variant_overrides,
)
from bench.packing import packing_table
from bench.render_packed import section_packed
from pipeline.core.config import load_config
from pipeline.core.synthetic import seed902k_lengths


def _records(tokens_per_s, losses):
    """Rank-0 metric lines as the trainer writes them at train.log_every=1."""
    return [
        {
            "step": i + 1,
            "perf/step_s": 0.5,
            "data/real_tokens_per_s": tps,
            "data/padded_tokens_per_s": tps * 1.25,
            "data/wait_fraction": 0.0,
            "train/loss": loss,
            "train/loss_debiased": loss - 0.01 * (i % 2),
            "train/bucket": i % 2,
        }
        for i, (tps, loss) in enumerate(zip(tokens_per_s, losses, strict=True))
    ]


def _run(tokens_per_s, losses, **extra):
    base = {"wall_s": 10.0, "samples": 100, "tokens": 5000, "final_loss": losses[-1]}
    return run_figures(_records(tokens_per_s, losses)) | base | {"load1": [1.0, 2.0]} | extra


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_selects_its_batching_on_the_demo_config_at_the_same_token_budget(variant):
    base = load_config(DEMO_CONFIG)
    T, budget = base.data.max_length, base.batching.token_budget
    cfg = load_config(
        DEMO_CONFIG, variant_overrides(variant, max_length=T, token_budget=budget, row_tokens=T)
    )
    if variant == "packed":
        assert cfg.batching.mode == "packed" and cfg.buckets.num_buckets == "auto"
        assert cfg.batching.rows_per_step * cfg.batching.row_tokens == budget
    else:
        assert cfg.batching.mode == "token_budget" and cfg.batching.token_budget == budget
        if variant == "sorted":
            assert cfg.plan.policy == "sorted" and cfg.buckets.edges == [0, T]
        else:
            assert cfg.plan.policy == "bucketed" and cfg.buckets.num_buckets == "auto"


def test_throughput_is_the_median_over_steps_after_warmup_and_the_ratio_is_per_round():
    # The first two steps (warm-up) are slow and left out; the median ignores one outlier.
    packed = _run([1, 1, 300, 310, 5000, 320], [5, 4, 3, 2.9, 2.8, 2.7])
    sorted_ = _run([1, 1, 200, 200, 200, 1], [5, 4, 3, 2.5, 3.1, 2.4])
    assert packed["median_real_tokens_per_s"] == pytest.approx(315)
    agg = aggregate_variant([packed], [sorted_])
    assert agg["vs_sorted"] == pytest.approx(315 / 200) and agg["steps"] == 6
    assert agg["padding_efficiency"] == pytest.approx(0.8)
    # The smoother curve has the smaller variance of its step-to-step changes.
    assert agg["diff_var_raw"] < aggregate_variant([sorted_], [sorted_])["diff_var_raw"]


def test_the_packed_rows_section_renders_the_measured_figures():
    kernel = measure_step_kernel(tokens=600, repeats=1)
    assert set(kernel["seconds"]) == {"padded", "packed", "packed_block_mask"}
    assert kernel["packed_slots"] < kernel["padded_slots"] + kernel["row_tokens"]
    paper = packing_table(seed902k_lengths(3000), pairs=20_000, balance_rows=64)
    runs = {
        "packed": _run([1, 1, 330, 331, 332], [5, 4, 3, 2.9, 2.8]),
        "sorted": _run([1, 1, 300, 300, 300], [5, 4, 3, 2.5, 3.1]),
        "auto": _run([1, 1, 290, 291, 292], [5, 4, 3, 2.6, 3.0]),
    }
    training = {
        "config": DEMO_CONFIG,
        "num_samples": 600,
        "max_length": 512,
        "token_budget": 16384,
        "row_tokens": 512,
        "repeats": 1,
        "warmup_steps_excluded": 2,
        "model": load_config(DEMO_CONFIG).model.model_dump(),
        "variants": {v: aggregate_variant([x], [runs["sorted"]]) for v, x in runs.items()},
    }
    results = {
        "meta": {
            "command": "python -m jobs.benchmark --quick",
            "date_utc": "2026-12-02 05:00 UTC",
            "machine": {"cpu": "Test CPU", "cores": 2, "gpu": None},
        },
        "packed": {
            "load_before": 3.25,
            "load_after": 4.5,
            "paper": paper,
            "kernel": kernel,
            "training": training,
        },
    }
    text = "\n".join(section_packed(results))
    assert "## Packed rows" in text and "`python -m jobs.benchmark --quick`" in text
    assert "2026-12-02 05:00 UTC" in text and "Test CPU, 2 cores" in text and "3.2 -> 4.5" in text
    assert f"| {331 / 300:.3f} |" in text and "ahead on CPU here: packed rows" in text
    assert "(goal >= 1.00x: met)" in text
    assert f"{kernel['seconds']['packed']:.3f}" in text
    assert f"{paper['pack_epoch_s']:.2f} s" in text and "3,000 samples" in text
    assert "token efficiency (8)" in text
    assert section_packed({"meta": results["meta"]}) == [
        "## Packed rows (`batching.mode: packed`)",
        "",
        "Not measured in this run.",
        "",
    ]
