"""A Hugging Face causal LM (tiny Llama, built from a local config) trains through the real Ray
Train path with bucketray's loss, checkpoints, and resumes exactly after a failure. Two fit() calls, one with a restart: minutes on two loaded cores, so slow;
the default suite trains a Hugging Face model once in tests/ray/test_own_data.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.core.config import validate
from pipeline.learn.checkpoint import load_checkpoint
from pipeline.train.launch import run
from pipeline.train.loop import FAIL_AT_STEP_ENV, FAIL_MARKER_ENV

pytestmark = [pytest.mark.ray, pytest.mark.slow]
pytest.importorskip("transformers")

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
STEPS, EVERY, FAIL_AFTER = 12, 5, 8


def _config(tmp: Path, name: str) -> dict:
    return {
        "data": {
            "synthetic": {"num_samples": 400, "shards": 2, "out_dir": str(tmp.parent / "data")},
            "max_length": 64,
            "over_length": "truncate",
        },
        "buckets": {"num_buckets": 2},
        "batching": {"token_budget": 512},
        "model": {"name": "hf_causal_lm", "vocab_size": 300, "hf_config": TINY_LLAMA},
        "train": {"epochs": 1, "max_steps": STEPS, "lr": 3e-3, "warmup_steps": 2, "log_every": 4},
        "wandb": {"mode": "disabled"},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "checkpoint": {
            "storage_path": str(tmp / "runs"),
            "run_name": name,
            "every_steps": EVERY,
            "max_failures": 1,
        },
    }


def test_tiny_llama_trains_checkpoints_and_resumes_exactly(cluster, tmp_path, monkeypatch):
    ref = run(validate(_config(tmp_path / "reference", "reference")))
    monkeypatch.setenv(FAIL_AT_STEP_ENV, str(FAIL_AFTER))
    monkeypatch.setenv(FAIL_MARKER_ENV, str(tmp_path / "failed-once"))
    resumed = run(validate(_config(tmp_path / "failed", "failed")))

    assert (tmp_path / "failed-once.rank0").exists()  # it did fail, and came back
    assert ref.steps == resumed.steps == STEPS
    assert ref.loss < 5.7  # below ln(300): it learned
    a, b = load_checkpoint(ref.checkpoint), load_checkpoint(resumed.checkpoint)
    assert any(k.startswith("hf.model.layers.1.") for k in a.model)
    assert a.model.keys() == b.model.keys()
    for k in a.model:
        torch.testing.assert_close(b.model[k], a.model[k], rtol=1e-5, atol=1e-6)
    assert resumed.loss == pytest.approx(ref.loss, rel=1e-5)
