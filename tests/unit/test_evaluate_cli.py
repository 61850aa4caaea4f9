"""jobs.evaluate before any worker starts: a model that does not fit the checkpoint is refused in
one line (exit 2) on the driver, and a run's relative data paths are found from any working
directory (a run records absolute local paths; an older checkpoint's relative ones resolve
against the directory the run was started in)."""

from __future__ import annotations

import json

import pytest
import torch

from jobs import evaluate as evaluate_job
from pipeline.core.config import validate
from pipeline.learn.checkpoint import (
    RUN_CONFIG_FILE,
    DataPosition,
    TrainState,
    save_checkpoint,
    save_run_config,
)
from pipeline.learn.factory import build_model
from pipeline.learn.model_record import model_record
from tests.helpers import tiny_raw


def _checkpoint(run_dir, cfg):
    """One complete checkpoint of `cfg`'s model with the run's config beside it."""
    torch.manual_seed(0)
    model = build_model(cfg.model, max_positions=64)
    d = run_dir / "checkpoint_step00000010"
    state = TrainState(
        model=model.state_dict(),
        optimizer={},
        scheduler={},
        position=DataPosition(0, 10, "h", 2, {"buckets.edges": [0, 32, 64]}, 10),
        wandb_run_id="x",
        model_record=model_record(cfg.model),
    )
    save_checkpoint(d, state, rank=0)
    save_run_config(d, cfg)
    return d


@pytest.fixture
def no_ray(monkeypatch):
    """jobs.evaluate must refuse before it starts or joins Ray."""
    import pipeline.train.launch as launch

    def refuse(*a, **k):
        raise AssertionError("Ray was started: the refusal came after the driver's checks")

    monkeypatch.setattr(launch, "init_ray", refuse)


@pytest.mark.parametrize(
    "override, named",
    [
        ("model.d_model=64", "model.d_model: 32 -> 64"),
        ("model.vocab_size=300", "model.vocab_size: 64 -> 300"),
    ],
)
def test_a_model_that_does_not_fit_the_checkpoint_is_one_line_and_exit_2(
    tmp_path, capsys, no_ray, override, named
):
    cfg = validate(tiny_raw(tmp_path, eval={"path": str(tmp_path / "held_out")}))
    run_dir = tmp_path / "runs" / "r"
    d = _checkpoint(run_dir, cfg)
    assert evaluate_job.main([str(run_dir), "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"the checkpoint {d} was trained as another model ({named})" in err
    assert "drop the --set model.* overrides" in err


def test_a_run_records_absolute_local_data_paths_for_its_workers_and_checkpoints(
    tmp_path, monkeypatch
):
    from pipeline.train.launch import _loop_inputs

    monkeypatch.chdir(tmp_path)
    raw = tiny_raw(
        None,
        data={"path": "data/mine"},
        eval={"path": "data/heldout"},
        checkpoint={"storage_path": "runs"},
    )
    raw["data"]["path"] = "data/mine"
    cfg = validate(raw)
    sent = _loop_inputs(cfg, "feeder", [0, 64], [5], [{"hash": "h"}], {}).cfg
    assert sent["data"]["path"] == str(tmp_path / "data" / "mine")
    assert sent["eval"]["path"] == str(tmp_path / "data" / "heldout")
    assert sent["checkpoint"]["storage_path"] == str(tmp_path / "runs")
    # A URI is not a local path: kept as it is.
    s3 = validate({**raw, "data": {**raw["data"], "path": "s3://bucket/data"}})
    assert _loop_inputs(s3, "f", [0, 64], [5], [{"hash": "h"}], {}).cfg["data"]["path"] == (
        "s3://bucket/data"
    )


def test_an_older_checkpoints_relative_paths_resolve_against_the_runs_directory(
    tmp_path, monkeypatch
):
    """An older checkpoint recorded data.path relative to where the run started; its relative
    checkpoint.storage_path says where that was. From another directory, jobs.evaluate finds
    the data there, and a path given with --set resolves against today's directory."""
    from pipeline.train.evaluate_run import find_checkpoint

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    raw = tiny_raw(None, data={"path": "data/mine"}, eval={"path": "data/heldout"})
    raw["checkpoint"] = {**raw["checkpoint"], "storage_path": "runs", "run_name": "r"}
    d = _checkpoint(project / "runs" / "r", validate(raw))
    assert json.loads((d / RUN_CONFIG_FILE).read_text())["data"]["path"] == "data/mine"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    target = find_checkpoint(str(project / "runs" / "r"))
    cfg = evaluate_job.checkpoint_config(target, ["eval.path=other/heldout"])
    assert cfg.data.path == str(project / "data" / "mine")
    assert cfg.checkpoint.storage_path == str(project / "runs")
    assert cfg.eval.path == "other/heldout"  # the user's own, relative to where they are
