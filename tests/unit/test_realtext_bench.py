"""The real-text benchmark's pieces: per-bucket curves at each bucket's own steps, the PNG, and the
runs' overrides."""

from __future__ import annotations

import numpy as np

from bench.plots import plot_bucket_curves
from bench.quality import loss_readability
from bench.realtext import bucket_curves


def _fake_result(n: int = 60) -> dict:
    rng = np.random.default_rng(0)
    buckets = rng.integers(0, 4, n)
    trend = np.linspace(5.0, 3.0, n)
    loss = trend + 0.4 * buckets + rng.normal(0, 0.01, n)  # each bucket: its own offset
    debiased = trend + rng.normal(0, 0.01, n)
    curves = {
        "loss": [(i + 1, float(v)) for i, v in enumerate(loss)],
        "loss_debiased": [(i + 1, float(v)) for i, v in enumerate(debiased)],
        "bucket": [int(b) for b in buckets],
    }
    per = bucket_curves(curves)
    return {
        "corpus": {"python": "3.11.7", "samples": 18237, "tokens": 1, "vocab_size": 259},
        "max_length": 512,
        "token_budget": 8192,
        "steps": n,
        "num_buckets": 4,
        "readability": loss_readability(curves, skip=n // 4),
        "bucket_mean_loss_span": [3.1, 4.3],
        "bucket_loss_corr": 0.97,
        "curves": {**curves, "per_bucket": {str(k): v for k, v in per.items()}},
    }


def test_bucket_curves_keep_each_bucket_at_its_own_steps():
    curves = {"loss": [(1, 5.0), (2, 3.0), (3, 4.9), (4, 2.9)], "bucket": [1, 0, 1, 0]}
    assert bucket_curves(curves) == {0: [(2, 3.0), (4, 2.9)], 1: [(1, 5.0), (3, 4.9)]}


def test_offsets_make_the_raw_curve_jumpy_and_the_plot_is_written(tmp_path):
    r = _fake_result()
    assert r["readability"]["ratio"] < 0.5  # constructed offsets: debiasing removes the jumps
    path = plot_bucket_curves(r, tmp_path / "rt.png")
    assert (tmp_path / "rt.png").stat().st_size > 5000 and path.endswith("rt.png")


def test_the_runs_overrides_load_on_the_default_config(tmp_path):
    from pathlib import Path

    import yaml

    from bench.common import config_step_tokens
    from bench.realtext import realtext_overrides
    from pipeline.core.config import load_config

    local = Path(__file__).resolve().parents[2] / "configs" / "local_full.yaml"
    # padded batches of as many tokens as a step of the full local run holds, by default
    own = yaml.safe_load(local.read_text())["batching"]
    step = config_step_tokens(str(local))
    assert step == own["rows_per_step"] * own["row_tokens"]
    o = realtext_overrides(
        tmp_path, str(tmp_path / "c"), "rt", max_length=512, max_steps=300, token_budget=step
    )
    cfg = load_config(str(local), o)
    assert cfg.buckets.num_buckets == "auto" and cfg.model.vocab_size == 259
    assert cfg.train.log_every == 1 and cfg.train.metrics_file.endswith("metrics/rt.jsonl")
    assert cfg.data.path == str(tmp_path / "c") and cfg.train.max_steps == 300
    assert cfg.batching.mode == "token_budget" and cfg.batching.token_budget == step
    o = realtext_overrides(tmp_path, "c", "rt", max_length=512, max_steps=3, token_budget=8192)
    assert load_config(str(local), o).batching.token_budget == 8192
