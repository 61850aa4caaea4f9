"""The baselines the benchmarks compare against run with the shipped demo config switched to
padded batches (the switch its refusal of a baseline with packed rows names): a policy's plan
is one bucket up to the top edge whatever the config's edges, and collation pads within the
plan's own edges (a sorted plan used to stop at step 1 on the demo's 8 edges)."""

from __future__ import annotations

import json

import pytest

from jobs import train as train_job

pytestmark = pytest.mark.ray


def _train(tmp_path, policy: str) -> list[dict]:
    metrics = tmp_path / "metrics.jsonl"
    code = train_job.main(
        [
            "--config",
            "configs/local.yaml",
            "--set",
            f"plan.policy={policy}",
            "--set",
            "batching.mode=token_budget",
            "--set",
            "batching.token_budget=16384",
            "--set",
            "train.max_steps=3",
            "--set",
            "eval.at_start=false",
            "--set",
            f"data.synthetic.out_dir={tmp_path / 'corpus'}",
            "--set",
            f"checkpoint.storage_path={tmp_path / 'runs'}",
            "--set",
            "wandb.mode=disabled",
            "--set",
            f"train.metrics_file={metrics}",
            "--set",
            "train.log_every=1",
        ]
    )
    assert code == 0
    return [json.loads(x) for x in metrics.read_text().splitlines()]


@pytest.mark.slow
def test_the_sorted_baseline_trains_on_the_shipped_demo_config(cluster, tmp_path):
    lines = _train(tmp_path, "sorted")
    steps = [m for m in lines if "train/loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert {m["train/bucket"] for m in steps} == {0}  # one bucket, [0, top]
    assert any("eval/loss" in m for m in lines)  # the run's end is evaluated


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["random", "megabatch", "sorted_ascending"])
def test_every_baseline_trains_on_the_shipped_demo_config(cluster, tmp_path, policy):
    steps = [m for m in _train(tmp_path, policy) if "train/loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
