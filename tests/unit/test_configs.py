"""The shipped configs parse, and say what the issue and DESIGN.md say they say."""

from pathlib import Path

import pytest

from pipeline.core.config import TEAM_EDGES, ConfigError, load_config

CONFIGS = sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_validates(path):
    load_config(path)


def test_local_config_is_small_cpu_and_offline():
    cfg = load_config("configs/local.yaml")
    assert not cfg.scaling.use_gpu and cfg.scaling.num_workers == 2
    assert cfg.data.path is None and cfg.buckets.edges is None and cfg.wandb.mode == "offline"


def test_team_config_matches_the_measured_run():
    cfg = load_config("configs/dflash_902k.yaml")
    assert cfg.buckets.edges == TEAM_EDGES == [0, 770, 1216, 1728, 2432, 3296, 8192]
    assert cfg.train.lr == 6e-4 and cfg.train.warmup_steps == 3598 and cfg.scaling.use_gpu
    assert cfg.data.synthetic.num_samples == 902_087


def test_config_errors_are_one_line_naming_the_field():
    with pytest.raises(ConfigError) as e:
        load_config("configs/local.yaml", ["train.warmup_steps=10"])
    assert "\n" not in str(e.value) and "train.warmup_steps" in str(e.value)
    with pytest.raises(ConfigError, match=r"^invalid config: train.lrr: unknown field"):
        load_config("configs/local.yaml", ["train.lrr=1"])
