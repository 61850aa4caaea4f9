"""Config: strict validation, overrides, errors that name the field and the fix."""

from __future__ import annotations

import pytest

from pipeline.core.config import ConfigError, RunConfig, apply_overrides, load_config, validate


def test_defaults_validate_and_round_trip_through_a_dict():
    cfg = RunConfig()
    assert RunConfig.model_validate(cfg.model_dump(mode="json")) == cfg


def test_overrides_are_parsed_as_yaml_values():
    cfg = load_config(
        None, ["train.lr=3e-4", "buckets.edges=[0, 770, 8192]", "scaling.use_gpu=true"]
    )
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.buckets.edges == [0, 770, 8192]
    assert cfg.scaling.use_gpu is True


def test_overrides_do_not_mutate_input():
    raw = {"train": {"lr": 1.0}}
    apply_overrides(raw, ["train.lr=2.0"])
    assert raw == {"train": {"lr": 1.0}}


@pytest.mark.parametrize(
    "override, fragment",
    [
        (
            "buckets.edges=[0, 770, 700]",
            "buckets.edges must be strictly increasing: got [0, 770, 700]",
        ),
        ("train.lrr=1e-3", "train.lrr: unknown field"),
        ("model.n_heads=3", "model.n_heads=3 must divide model.d_model=128"),
        ("buckets.num_buckets=100", "buckets.num_buckets"),
        ("batching.mode=sorted", "batching.mode"),
        ("buckets.edges=[0, 770, 9000]", "exceeds data.max_length=8192"),
    ],
)
def test_contract10_config_errors_name_field_and_fix(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_warmup_steps_and_ratio_are_exclusive():
    with pytest.raises(ConfigError, match="choose one"):
        validate({"train": {"warmup_steps": 10, "warmup_ratio": 0.1}})


def test_missing_config_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(None, ["train.lr"])


def test_inert_knob_warns():
    cfg = load_config(None, ["batching.mode=fixed", "batching.token_budget=1000"])
    with pytest.warns(UserWarning, match="token_budget has no effect"):
        cfg.warn_inert_knobs()


def test_contract8_elastic_scaling_range_and_its_errors():
    cfg = load_config(None, ["scaling.num_workers=4", "scaling.min_workers=2"])
    assert cfg.scaling.ray_num_workers() == (2, 4)
    assert load_config(None, ["scaling.num_workers=4"]).scaling.ray_num_workers() == 4
    with pytest.raises(ConfigError, match="scaling.min_workers=5 exceeds scaling.num_workers=4"):
        load_config(None, ["scaling.num_workers=4", "scaling.min_workers=5"])
    contradictory = load_config(None, ["scaling.min_workers=1", "plan.on_world_size_change=refuse"])
    with pytest.warns(UserWarning, match="will stop a resized resume"):
        contradictory.warn_inert_knobs()
