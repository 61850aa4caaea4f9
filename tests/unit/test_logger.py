"""One logger interface: W&B on rank 0 only, no-op elsewhere, capturable in tests."""

import json

from pipeline.learn.logger import (
    JsonlLogger,
    ListLogger,
    NullLogger,
    TeeLogger,
    make_logger,
    wandb_mode,
)
from tests.helpers import tiny_config


def test_non_zero_ranks_log_nothing(tmp_path):
    lg = make_logger(
        tiny_config(), rank=1, run_id="x", wandb_dir=str(tmp_path), metrics_file=str(tmp_path / "m")
    )
    assert isinstance(lg, NullLogger)
    lg.log({"train/loss": 1.0}, step=1)
    assert not (tmp_path / "m").exists()


def test_disabled_wandb_with_metrics_file_writes_json_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    lg = make_logger(
        tiny_config(),
        rank=0,
        run_id="x",
        wandb_dir=str(tmp_path),
        metrics_file=str(tmp_path / "m.jsonl"),
    )
    lg.log({"train/loss": 2.5}, step=3)
    lg.finish()
    assert [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()] == [
        {"step": 3, "train/loss": 2.5}
    ]


def test_online_without_key_falls_back_to_offline(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = tiny_config(wandb={"mode": "online"})
    import pytest

    with pytest.warns(UserWarning, match="WANDB_API_KEY"):
        assert wandb_mode(cfg) == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode(cfg) == "disabled"


def test_tee_and_list_loggers_capture_every_call(tmp_path):
    a = ListLogger()
    TeeLogger(a, JsonlLogger(tmp_path / "x.jsonl")).log({"data/wait_fraction": 0.1}, step=5)
    assert a.records == [(5, {"data/wait_fraction": 0.1})] and a.keys() == {"data/wait_fraction"}


def test_offline_wandb_run_resumes_its_id(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    lg = make_logger(tiny_config(), rank=0, run_id="abcd1234", wandb_dir=str(tmp_path))
    lg.log({"train/loss": 1.0}, step=1)
    lg.finish()
    assert list((tmp_path / "wandb").glob("offline-run-*-abcd1234"))
