"""The "Packed rows" benchmark: variants select what they claim, figures come from the metric lines
and measurements, and the packed tables of BENCHMARKS.md show them."""

from __future__ import annotations

import numpy as np
import pytest

from bench import table_blocks as tb
from bench.common import config_step_tokens
from bench.kernels import _plan_micro_batches
from bench.packed_training import (
    DEMO_CONFIG,
    ROW_LENGTHS,
    VARIANTS,
    aggregate_variant,
    measure_plan_kernel,
    measure_step_kernel,
    run_figures,
    variant_overrides,
)
from bench.packing import packing_table
from bench.training import scaled_lengths
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
    T, budget = base.data.max_length, config_step_tokens(DEMO_CONFIG)
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


def _variant_configs(row_tokens: int):
    base = load_config(DEMO_CONFIG)
    T, budget = base.data.max_length, config_step_tokens(DEMO_CONFIG)
    return {
        v: load_config(
            DEMO_CONFIG,
            variant_overrides(v, max_length=T, token_budget=budget, row_tokens=row_tokens),
        )
        for v in VARIANTS
    }


def test_plan_micro_batches_are_the_ranks_micro_batches_of_each_variants_plan():
    from pipeline.core.epochs import epoch_plan_for, resolve_edges

    lengths = scaled_lengths(1500, 512, seed=3).astype(np.int64)
    ids = np.arange(lengths.size, dtype=np.int64) * 7  # ids need not be positions
    for v, cfg in _variant_configs(ROW_LENGTHS * 512).items():
        index = type("I", (), {"lengths": lengths, "sample_ids": ids})
        plan = epoch_plan_for(cfg, index, resolve_edges(cfg, lengths), 0, 2)
        view = plan.rank_view(1)
        sizes = np.diff(view.offsets)
        picked = np.flatnonzero(sizes > 0)[::3]
        m = _plan_micro_batches(cfg, lengths, ids, rank=1, every=3, rng=np.random.default_rng(0))
        assert m["steps"] == plan.num_steps and m["micro_batches"] == picked.size > 0
        want = [int(view.lengths[view.offsets[i] : view.offsets[i + 1]].sum()) for i in picked]
        assert m["real"] == want
        longest = [int(view.lengths[view.offsets[i] : view.offsets[i + 1]].max()) for i in picked]
        for b, real, top in zip(m["batches"], want, longest, strict=True):
            # Every real token is an input position; padding and filler are pad ids.
            assert int((b["input_ids"] != 0).sum()) == real
            width = b["input_ids"].shape[1]
            if v == "packed":
                assert width == ROW_LENGTHS * 512
            else:  # padded to the longest, rounded up (at most to the bucket's edge)
                assert top <= width < top + cfg.batching.pad_to_multiple_of
        assert m["slots"] == sum(int(b["input_ids"].numel()) for b in m["batches"])


def test_plan_kernel_times_every_variant_against_sorted_static():
    lengths = scaled_lengths(400, 512, seed=1).astype(np.int64)
    configs = _variant_configs(ROW_LENGTHS * 512)
    k = measure_plan_kernel(lengths, np.arange(lengths.size), configs, every=1, blocks=2)
    v = k["variants"]
    assert set(v) == set(VARIANTS) and k["world_size"] == 2 and k["rank"] == 0
    assert v["sorted"]["vs_sorted"] == 1.0 and v["sorted"]["vs_sorted_blocks"] == [1.0, 1.0]
    for x in v.values():
        assert x["seconds"] > 0 and 0 < x["token_efficiency"] <= 1
        assert x["real_tokens_per_s"] == pytest.approx(x["real_tokens"] / x["seconds"])
        assert x["vs_sorted"] == pytest.approx(
            x["real_tokens_per_s"] / v["sorted"]["real_tokens_per_s"]
        )
    assert v["packed"]["slots"] % (ROW_LENGTHS * 512) == 0


def test_the_packed_tables_show_the_measured_figures():
    kernel = measure_step_kernel(tokens=600, repeats=1)
    assert set(kernel["seconds"]) == {"padded", "packed", "packed_block_mask"}
    assert kernel["packed_slots"] < kernel["padded_slots"] + kernel["row_tokens"]
    paper = packing_table(seed902k_lengths(3000), pairs=20_000, balance_rows=64)
    lengths = scaled_lengths(600, 512).astype(np.int64)
    configs = _variant_configs(ROW_LENGTHS * 512)
    plan_kernel = measure_plan_kernel(lengths, np.arange(lengths.size), configs, every=8)
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
    r = {"packed_training": {"packed": {"paper": paper, "kernel": kernel, "training": training,
                                        "plan_kernel": plan_kernel}}}  # fmt: skip
    text = "\n".join(
        fn(r) for fn in (tb.packed_setup, tb.packed_training, tb.packed_compute, tb.packed_kernel)
    ) + tb.packed_paper(r)  # fmt: skip
    assert f"| {331 / 300:.3f} | 1.10 |" in text  # the ratio to sorted-static, its one round
    assert f"| {kernel['seconds']['packed']:.3f} |" in text
    pk = plan_kernel["variants"]["packed"]
    assert "micro-batches (rank 0 of 2, 1 in 8)" in text
    assert f"| {pk['micro_batches']} | {pk['real_tokens']:,} |" in text
    assert f"| 3,000 | {paper['attention_width']:,} |" in text and "token efficiency (8)" in text
    assert f"| {paper['pack_epoch_s']:.2f} |" in text
    assert "nan" not in text and "None" not in text
