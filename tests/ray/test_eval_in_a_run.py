"""Held-out evaluation in a real run (2 CPU workers) and on its own (`jobs.evaluate`): the run
logs `eval/*` and keeps its evaluations in every checkpoint; a checkpoint evaluated alone gives
the run's own figures whatever the number of workers; bad held-out input ends in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from jobs import evaluate as evaluate_job
from pipeline.core.config import validate
from pipeline.data.errors import DataError
from pipeline.data.evalset import load_eval_set
from pipeline.data.index import build_length_index, resolve_data_path
from pipeline.train.history import EvalHistory
from tests.helpers import tiny_raw, write_held_out

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def trained(cluster, tiny_run):
    return tiny_run


def test_contract11_the_run_evaluates_its_held_out_set_and_keeps_every_evaluation(trained):
    cfg, summary, metrics, _ = trained
    evals = [m for m in metrics if "eval/loss" in m]
    first_epoch = next(m["epoch/steps"] for m in metrics if "epoch/steps" in m)
    every_10 = set(range(10, summary.steps + 1, 10))
    want = sorted(every_10 | {first_epoch, summary.steps})  # each epoch's end, the run's end
    assert [m["step"] for m in evals] == want
    assert all(m["eval/samples"] == 40 for m in evals)  # every held-out sample, every time
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    assert all(np.isfinite(m["eval/accuracy"]) for m in evals)
    kept = EvalHistory.read_dir(summary.checkpoint).arrays()
    assert kept["step"].tolist() == want
    np.testing.assert_allclose(kept["loss"], [m["eval/loss"] for m in evals], rtol=1e-9)


def test_jobs_evaluate_gives_the_runs_own_figures_of_its_checkpoint(trained, tmp_path, capsys):
    cfg, summary, metrics, tmp = trained
    last = [m for m in metrics if "eval/loss" in m][-1]
    out = tmp_path / "eval.json"
    run_dir = str(Path(cfg.checkpoint.storage_path) / cfg.checkpoint.run_name)
    assert evaluate_job.main([run_dir, "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["step"] == summary.steps and got["eval/samples"] == 40
    for k in ("eval/loss", "eval/accuracy", "eval/loss_per_sample"):
        assert got[k] == pytest.approx(last[k], rel=1e-5), k
    printed = capsys.readouterr().out
    assert "eval/loss" in printed and "eval/loss_by_bucket/0" in printed


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 3])
def test_contract11_a_checkpoint_evaluates_the_same_on_1_and_3_workers(trained, tmp_path, workers):
    cfg, summary, metrics, tmp = trained
    last = [m for m in metrics if "eval/loss" in m][-1]
    out = tmp_path / "eval.json"
    run_dir = str(Path(cfg.checkpoint.storage_path) / cfg.checkpoint.run_name)
    args = [run_dir, "--json", str(out), "--set", f"scaling.num_workers={workers}"]
    args += ["--set", "scaling.cpus_per_worker=0.3"]
    assert evaluate_job.main(args) == 0
    got = json.loads(out.read_text())
    assert got["eval/loss"] == pytest.approx(last["eval/loss"], rel=1e-5)
    assert got["eval/samples"] == 40


def _index(cfg):
    return build_length_index(cfg, resolve_data_path(cfg))


def test_bad_held_out_input_is_one_line_naming_the_fix(cluster, tmp_path):
    base = tiny_raw(tmp_path)
    train = validate(base)
    index = _index(train)

    def load(**ev):
        return load_eval_set(validate({**base, "eval": ev}), index)

    with pytest.raises(DataError, match=r"eval.path=.*does not exist"):
        load(path=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"eval.path=.*no shards"):
        load(path=str(tmp_path / "empty"))
    # A held-out shard copied from the training data: every sample is in both.
    leak = tmp_path / "leak"
    leak.mkdir()
    shard = sorted(Path(index.path).glob("*.parquet"))[0]
    shutil.copy(shard, leak / "held.parquet")
    n = pq.read_metadata(shard).num_rows
    with pytest.raises(DataError, match=rf"{n} of {n} held-out samples are in the training data"):
        load(path=str(leak))
    # Half copied, half new, with eval.on_overlap=drop: the copies go, the rest is evaluated.
    held = write_held_out(tmp_path / "mixed", n=30)
    shutil.copy(shard, Path(held) / "copied.parquet")
    got = load(path=held, on_overlap="drop")
    assert got.num_samples == 30 and got.dropped == n
    # Longer than the top edge: truncated like training (data.over_length=truncate), counted.
    long = load(path=write_held_out(tmp_path / "long", n=10, max_length=200))
    assert long.lengths.max() <= 64 and long.truncated > 0


@pytest.mark.slow
def test_async_evaluations_are_made_by_ray_train_tasks_and_drawn(cluster, tmp_path):
    from pipeline.train.launch import run
    from pipeline.train.run_picture import draw_run

    raw = tiny_raw(
        tmp_path,
        train={"epochs": 1},
        checkpoint={"run_name": "async"},
        eval={"path": write_held_out(tmp_path / "held"), "every_steps": 10, "mode": "async"},
    )
    summary = run(validate(raw))
    run_dir = tmp_path / "runs" / "async"
    records = [json.loads(p.read_text()) for p in sorted((run_dir / "evals").glob("*.json"))]
    want = sorted(set(range(10, summary.steps + 1, 10)) | {summary.steps})
    assert [r["step"] for r in records] == want  # every one, before the run ended
    assert all(r["eval/samples"] == 40 and r["eval/latency_s"] > 0 for r in records)
    assert EvalHistory.read_dir(summary.checkpoint).arrays()["step"].size == 0  # none inline
    assert Path(draw_run(str(run_dir), str(tmp_path / "run.png"))).is_file()
