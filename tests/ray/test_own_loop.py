"""examples/own_loop.py -- a model and loop of its own on bucketray's delivery -- runs and learns."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own_loop.py"


def test_the_example_refuses_packed_rows_its_gru_would_read_across():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "configs/local.yaml"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        "own_loop: this GRU needs padded batches: add batching.token_budget=16384"
    ]


def test_the_example_stays_short_and_defines_its_own_model():
    src = EXAMPLE.read_text()
    assert len(src.splitlines()) <= 62
    classes = [n.name for n in ast.parse(src).body if isinstance(n, ast.ClassDef)]
    assert classes == ["GRULM"] and "pipeline.learn" not in src


# A whole process with its own Ray instance (~35 s): make test-slow. The default suite keeps the
# example's shape above and the own-loop API it uses (tests/ray/test_delivery_api.py).
@pytest.mark.slow
def test_own_loop_example_trains_on_bucketed_batches(tmp_path):
    cfg = {
        "data": {
            "synthetic": {"num_samples": 400, "shards": 2, "out_dir": str(tmp_path / "data")},
            "max_length": 64,
            "over_length": "truncate",
        },
        "buckets": {"num_buckets": 3},
        "batching": {"token_budget": 512},
        "model": {"vocab_size": 64},
        "train": {"epochs": 2, "lr": 1e-2},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "checkpoint": {"storage_path": str(tmp_path / "runs")},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "c.yaml"), "train.max_steps=30"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("own_loop:"))
    metrics, weights = line.removeprefix("own_loop:").split(" weights: ")
    m = ast.literal_eval(metrics.strip())
    assert m["steps"] == 30  # train.max_steps, across the epoch boundary
    assert m["last_loss"] < 0.8 * m["first_loss"]
    assert (Path(weights) / "model.pt").is_file()
