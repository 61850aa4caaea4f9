"""Secrets and untrusted files: the W&B key lives only in the environment (never in W&B's run
files, the config or a checkpoint), YAML is safe-loaded, checkpoints cannot run code.
(Token authentication on the job server: tests/unit/test_infra.py and
tests/ray/test_submit_script.py::test_jobs_api_refuses_requests_without_the_token.)"""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml

from pipeline.core.config import ConfigError, RunConfig, load_config
from pipeline.learn.checkpoint import DataPosition, TrainState, load_checkpoint, save_checkpoint
from pipeline.learn.logger import make_logger
from tests.helpers import tiny_config

SECRET = "bucketray-test-secret-0123456789abcdef0123"


def _tiny_state(cfg: RunConfig) -> TrainState:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    return TrainState(
        model=model.state_dict(),
        optimizer=opt.state_dict(),
        scheduler={},
        position=DataPosition(0, 1, "h", 1, {}, 1),
        wandb_run_id="abcd1234",
        counters={"config": json.dumps(cfg.model_dump(mode="json"))},
    )


def test_wandb_key_from_environment_never_written_to_run_files_config_or_checkpoint(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_config(wandb={"mode": "offline"})
    assert SECRET not in json.dumps(cfg.model_dump(mode="json"))  # no config field holds a key
    lg = make_logger(cfg, rank=0, run_id="abcd1234", wandb_dir=str(tmp_path / "wandb"))
    lg.log({"train/loss": 1.0}, step=1)
    lg.finish()
    save_checkpoint(tmp_path / "ckpt", _tiny_state(cfg), rank=0)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any("offline-run-" in str(p) for p in files)  # W&B really wrote its run files
    assert [str(p) for p in files if SECRET.encode() in p.read_bytes()] == []


def test_yaml_config_is_safe_loaded_no_python_objects(tmp_path):
    marker = tmp_path / "ran"
    bad = tmp_path / "evil.yaml"
    bad.write_text(f'train: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises((yaml.YAMLError, ConfigError)):
        load_config(bad)
    with pytest.raises((yaml.YAMLError, ConfigError)):
        load_config(None, [f'train.seed=!!python/object/apply:os.system ["touch {marker}"]'])
    assert not marker.exists()


class _RunsCode:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_checkpoint_with_pickled_code_is_refused_not_run(tmp_path):
    save_checkpoint(tmp_path, _tiny_state(tiny_config()), rank=0)
    marker = tmp_path / "ran"
    torch.save(
        {"scheduler": _RunsCode(str(marker)), "counters": {}, "tracker": {}},
        tmp_path / "trainer.pt",
    )
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported global"):
        load_checkpoint(tmp_path)
    assert not marker.exists()
