"""One logger interface: W&B on rank 0 only, no-op elsewhere, capturable in tests."""

import json
import re
import socket

import pytest

from pipeline.learn.logger import (
    JsonlLogger,
    ListLogger,
    NullLogger,
    SkipLoggedSteps,
    TeeLogger,
    make_logger,
    run_id_for,
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


def test_run_id_is_derived_from_the_run_directory():
    a = run_id_for("/data/runs/exp1")
    assert a == run_id_for("/data/runs/exp1/") and len(a) == 12
    assert a != run_id_for("/data/runs/exp2") and a != run_id_for("/other/runs/exp1")


def test_steps_logged_by_an_earlier_attempt_are_skipped(tmp_path):
    """A restart re-trains steps 11..14 (its checkpoint was at 10; the crash came after 14):
    they are logged once, and several calls at one step within an attempt all pass."""
    first, second = ListLogger(), ListLogger()
    lg = SkipLoggedSteps(first, tmp_path / "last.json")
    for s in (5, 10, 10, 14):
        lg.log({"s": s}, step=s)
    lg = SkipLoggedSteps(second, tmp_path / "last.json")
    for s in (10, 12, 14, 15, 15, 20):
        lg.log({"s": s}, step=s)
    assert [s for s, _ in first.records] == [5, 10, 10, 14]
    assert [s for s, _ in second.records] == [15, 15, 20]


def test_offline_restart_before_any_checkpoint_continues_one_wandb_run(tmp_path, monkeypatch):
    """Two attempts of one run without a checkpoint between them: one W&B run id, and the
    second attempt logs only the steps after the first's."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_config()
    rid = run_id_for(str(tmp_path / "runs" / cfg.checkpoint.run_name))
    for steps in ([1, 2, 3], [1, 2, 3, 4]):
        lg = make_logger(cfg, rank=0, run_id=rid, wandb_dir=str(tmp_path))
        for s in steps:
            lg.log({"train/loss": 1.0 / s}, step=s)
        lg.finish()
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    # One folder per attempt (one, if both started within the same second): all with one id.
    # offline-run-<time>-<id>, with "-1", "-2" appended when two attempts start in one second.
    ids = {
        re.fullmatch(r"offline-run-\d{8}_\d{6}-([0-9a-z]+)(-\d+)?", p.name).group(1) for p in runs
    }
    assert runs and ids == {rid}
    assert json.loads((tmp_path / f"bucketray-logged-step-{rid}.json").read_text()) == {"step": 4}


def test_online_without_a_reachable_server_falls_back_to_offline(tmp_path, monkeypatch):
    """W&B pointed at a closed loopback port: wandb.init gives up after wandb.init_timeout_s
    and the run logs offline with a warning (instead of waiting minutes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_config(wandb={"mode": "online", "init_timeout_s": 3})
    with pytest.warns(UserWarning, match="init_timeout_s=3.*logging offline"):
        lg = make_logger(cfg, rank=0, run_id="fallback1", wandb_dir=str(tmp_path))
    lg.log({"train/loss": 1.0}, step=1)
    lg.finish()
    assert list((tmp_path / "wandb").glob("offline-run-*-fallback1"))
