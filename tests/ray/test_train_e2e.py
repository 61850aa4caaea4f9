"""The training job end to end on 2 CPU workers and tiny data: loss falls, every metric is
logged, every sample is trained once per epoch, checkpoints are written and loadable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.config import ConfigError, validate
from pipeline.learn.checkpoint import load_checkpoint
from pipeline.learn.factory import build_model
from pipeline.train.history import StepHistory
from pipeline.train.launch import run
from tests.helpers import tiny_raw as tiny_config

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


@pytest.fixture(scope="module")
def trained(cluster, tiny_run):
    """(cfg, summary, metrics, tmp) of the session's tiny run (tests/ray/conftest.py)."""
    return tiny_run


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
    cfg, summary, metrics, tmp = trained
    kept = sorted((tmp / "runs" / "e2e").glob("checkpoint_step*"))
    assert 1 <= len(kept) <= cfg.checkpoint.keep_last
    assert Path(summary.checkpoint) == kept[-1]
    state = load_checkpoint(summary.checkpoint)
    # Planned steps of epoch 1 (greedy fill: an epoch's count depends on its shuffle).
    steps_epoch1 = [m["epoch/steps"] for m in metrics if "epoch/steps" in m][1]
    assert state.position.steps_done == summary.steps
    assert (state.position.epoch, state.position.next_step) == (1, steps_epoch1)
    assert state.position.normalized(steps_epoch1).epoch == 2  # a resume starts epoch 2
    model = build_model(cfg.model, max_positions=64)
    model.load_state_dict(state.model)  # loadable into a fresh model


def test_the_run_ends_in_its_picture_drawn_from_every_step(trained):
    """Every global step is in the history saved with the last checkpoint, and the run's PNG
    (raw and debiased loss, per-bucket loss, LR, padding, tokens/s) lies beside the checkpoints."""
    cfg, summary, metrics, tmp = trained
    history = StepHistory.read_dir(summary.checkpoint).arrays()
    assert history["step"].tolist() == list(range(1, summary.steps + 1))
    assert set(history["bucket"].tolist()) == {0, 1}
    losses = {m["step"]: m["train/loss"] for m in metrics if "train/loss" in m}
    for step, loss in losses.items():  # the history's loss is the logged one
        assert history["loss"][step - 1] == pytest.approx(loss, rel=1e-6)
    assert history["real"].sum() == pytest.approx(summary.tokens)
    assert summary.picture == str(tmp / "runs" / "e2e" / "run.png")
    assert Path(summary.picture).read_bytes().startswith(b"\x89PNG")


def test_contract10_config_error_and_missing_data_path_are_one_line(cluster, tmp_path):
    with pytest.raises(ConfigError, match="train.warmup_ratio"):
        validate(tiny_config(tmp_path, train={"warmup_ratio": 0.1}))
    nowhere = {"path": str(tmp_path / "nowhere"), "synthetic": None}  # a path, not the corpus
    cfg = validate(tiny_config(tmp_path, data=nowhere))
    with pytest.raises(Exception) as e:
        run(cfg)
    assert str(tmp_path / "nowhere") in str(e.value) and "\n" not in str(e.value)
