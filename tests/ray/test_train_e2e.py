"""The training job end to end on 2 CPU workers and tiny data: loss falls, every metric is
logged, every sample is trained once per epoch, checkpoints are written and loadable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.config import ConfigError, validate
from pipeline.learn.checkpoint import load_checkpoint
from pipeline.learn.model import build_model
from pipeline.train.launch import run

pytestmark = pytest.mark.ray

STEP_METRICS = {
    "train/loss",
    "train/accuracy",
    "train/lr",
    "train/grad_norm",
    "train/bucket",
    "train/loss_debiased",
    "data/padding_efficiency",
    "data/real_tokens_per_s",
    "data/padded_tokens_per_s",
    "data/wait_fraction",
    "perf/step_s",
}
EPOCH_METRICS = {
    "epoch/steps",
    "epoch/samples",
    "epoch/tokens",
    "epoch/planned_padding_efficiency",
    "epoch/plan_hash",
}


def tiny_config(tmp: Path, **sections) -> dict:
    """600 synthetic samples cut at 64 tokens, a 1-layer model: ~30 steps per epoch."""
    cfg = {
        "data": {
            "synthetic": {"num_samples": 600, "shards": 2, "out_dir": str(tmp / "data")},
            "max_length": 64,
            "over_length": "truncate",
        },
        "buckets": {"num_buckets": 2},
        "batching": {"token_budget": 1024},
        "model": {"vocab_size": 64, "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64},
        "train": {"epochs": 2, "lr": 1e-2, "warmup_steps": 5, "log_every": 5},
        "wandb": {"mode": "disabled"},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "checkpoint": {"storage_path": str(tmp / "runs"), "every_steps": 20, "keep_last": 2},
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    return cfg


@pytest.fixture(scope="module")
def trained(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    cfg = validate(
        tiny_config(
            tmp,
            train={
                "metrics_file": str(tmp / "metrics.jsonl"),
                "record_sample_ids": str(tmp / "ids"),
            },
            checkpoint={"run_name": "e2e"},
        )
    )
    summary = run(cfg)
    metrics = [json.loads(x) for x in (tmp / "metrics.jsonl").read_text().splitlines()]
    return cfg, summary, metrics, tmp


def test_loss_falls(trained):
    _, summary, metrics, _ = trained
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert len(losses) >= 6
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.5, losses
    assert summary.loss == pytest.approx(losses[-1])


def test_every_listed_metric_is_logged(trained):
    _, _, metrics, _ = trained
    keys = {k for m in metrics for k in m}
    assert STEP_METRICS <= keys and EPOCH_METRICS <= keys
    assert any(k.startswith("train/loss_by_bucket/") for k in keys)
    assert {k for k in keys if k.startswith("epoch/steps_per_bucket/")} == {
        "epoch/steps_per_bucket/0",
        "epoch/steps_per_bucket/1",
    }
    step = [m for m in metrics if "train/loss" in m]
    assert all(
        0 < m["data/padding_efficiency"] <= 1 and 0 <= m["train/accuracy"] <= 1 for m in step
    )
    assert [m["epoch/index"] for m in metrics if "epoch/index" in m] == [0, 1]


def test_contract4_every_sample_once_per_epoch_on_one_rank(trained):
    """Contract 4 seen from inside the loop: the ids the workers actually trained."""
    _, summary, metrics, tmp = trained
    rows = [
        json.loads(x)
        for f in sorted((tmp / "ids").glob("rank*.jsonl"))
        for x in f.read_text().splitlines()
    ]
    rows = [r for r in rows if "ids" in r]
    epoch_samples = [m["epoch/samples"] for m in metrics if "epoch/samples" in m]
    for e in (0, 1):
        ids = np.concatenate([r["ids"] for r in rows if r["epoch"] == e])
        assert ids.size == np.unique(ids).size == epoch_samples[e]
    assert summary.samples == sum(epoch_samples)
    assert summary.steps == sum(m["epoch/steps"] for m in metrics if "epoch/steps" in m)


def test_checkpoints_written_kept_and_loadable(trained):
    cfg, summary, _, tmp = trained
    kept = sorted((tmp / "runs" / "e2e").glob("checkpoint_step*"))
    assert 1 <= len(kept) <= cfg.checkpoint.keep_last
    assert Path(summary.checkpoint) == kept[-1]
    state = load_checkpoint(summary.checkpoint)
    steps_per_epoch = summary.steps // 2
    assert state.position.steps_done == summary.steps
    assert (state.position.epoch, state.position.next_step) == (1, steps_per_epoch)
    assert state.position.normalized(steps_per_epoch).epoch == 2  # a resume starts epoch 2
    model = build_model(cfg.model, max_positions=64)
    model.load_state_dict(state.model)  # loadable into a fresh model


def test_contract10_config_error_and_missing_data_path_are_one_line(cluster, tmp_path):
    with pytest.raises(ConfigError, match="train.warmup_ratio"):
        validate(tiny_config(tmp_path, train={"warmup_ratio": 0.1}))
    nowhere = {"path": str(tmp_path / "nowhere"), "synthetic": None}  # a path, not the corpus
    cfg = validate(tiny_config(tmp_path, data=nowhere))
    with pytest.raises(Exception) as e:
        run(cfg)
    assert str(tmp_path / "nowhere") in str(e.value) and "\n" not in str(e.value)
