"""Config: strict validation, discriminated sections, typed overrides, one-line errors."""

from __future__ import annotations

import pytest

from pipeline.core.config import (
    ConfigError,
    ExplicitBuckets,
    FixedBatching,
    OptimisedBuckets,
    RunConfig,
    TokenBudgetBatching,
    apply_overrides,
    load_config,
    validate,
)
from tests.helpers import tiny_config, tiny_raw

SYNTH = {"data": {"synthetic": {}}}  # the smallest valid config: the synthetic corpus, asked for


def load(*overrides: str) -> RunConfig:
    return validate(apply_overrides(SYNTH, list(overrides)))


def error_of(*overrides: str, raw: dict | None = None) -> str:
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(SYNTH if raw is None else raw, list(overrides)))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_tiny_config_validates_and_round_trips_through_a_dict(tmp_path):
    cfg = tiny_config(tmp_path)
    assert RunConfig.model_validate(cfg.model_dump(mode="json")) == cfg
    fixed = tiny_config(tmp_path, batching={"mode": "fixed", "batch_size": 4}, buckets=None)
    assert isinstance(fixed.batching, FixedBatching) and isinstance(fixed.buckets, OptimisedBuckets)
    assert RunConfig.model_validate(fixed.model_dump(mode="json")) == fixed


def test_overrides_are_coerced_to_the_field_type():
    cfg = load(
        "train.lr=3e-4",
        "buckets.edges=[0, 770, 8192]",
        "scaling.use_gpu=true",
        "train.max_steps=1e3",
        "train.warmup_ratio=null",
    )
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.buckets.edges == [0, 770, 8192]
    assert cfg.scaling.use_gpu is True
    assert cfg.train.max_steps == 1000 and isinstance(cfg.train.max_steps, int)
    assert cfg.train.warmup_ratio is None


def test_text_fields_take_the_text_as_written():
    # YAML 1.1 would read these as True, 2024 and False.
    cfg = load("train.bf16=on", "checkpoint.run_name=2024", "wandb.project=no")
    assert cfg.train.bf16 == "on"
    assert cfg.checkpoint.run_name == "2024"
    assert cfg.wandb.project == "no"
    assert load("train.bf16=off").train.bf16 == "off"
    assert load("wandb.entity=null").wandb.entity is None
    assert load("buckets.num_buckets=auto").buckets.num_buckets == "auto"
    assert load("buckets.num_buckets=12").buckets.num_buckets == 12


def test_overrides_do_not_mutate_input():
    raw = {"train": {"lr": 1.0}}
    apply_overrides(raw, ["train.lr=2.0"])
    assert raw == {"train": {"lr": 1.0}}


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["buckets.edges=[0, 770, 700]"], "buckets.edges must be strictly increasing"),
        (["train.lrr=1e-3"], "train.lrr: unknown field"),
        (["model.n_heads=3"], "model.n_heads=3 must divide model.d_model=128"),
        (["buckets.num_buckets=100"], "buckets.num_buckets"),
        (["batching.mode=sorted"], "batching.mode='sorted' is not a mode"),
        (["buckets.edges=[0, 770, 9000]"], "exceeds data.max_length=8192"),
        (["train.warmup_steps=10", "train.warmup_ratio=0.1"], "choose one"),
        (
            ["scaling.num_workers=4", "scaling.min_workers=5"],
            "scaling.min_workers=5 exceeds scaling.num_workers=4",
        ),
    ],
)
def test_contract10_config_errors_name_field_and_fix(overrides, fragment):
    assert fragment in error_of(*overrides)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (
            ["batching.mode=fixed", "batching.token_budget=1000"],
            "batching.token_budget has no effect with batching.mode=fixed: remove it",
        ),
        (
            ["batching.round_to=4", "batching.mode=fixed"],
            "batching.round_to has no effect with batching.mode=fixed",
        ),
        (
            ["batching.fill=greedy", "batching.mode=fixed"],
            "batching.fill has no effect with batching.mode=fixed",
        ),
        (
            ["buckets.edges=[0, 512, 8192]", "buckets.max_recomposition_floor=0.1"],
            "buckets.max_recomposition_floor has no effect when buckets.edges is given",
        ),
        (
            ["batching.batch_size=16"],
            "batching.batch_size has no effect with batching.mode=token_budget: remove it, "
            "or set batching.mode=fixed",
        ),
        (
            ["buckets.edges=[0, 512, 8192]", "buckets.num_buckets=4"],
            "buckets.num_buckets has no effect when buckets.edges is given",
        ),
        (
            ["data.path=/data/shards"],
            "data.synthetic has no effect when data.path is set: remove data.synthetic",
        ),
        (
            ["scaling.min_workers=1", "plan.on_world_size_change=refuse"],
            "plan.on_world_size_change=refuse stops a resized resume",
        ),
    ],
)
def test_inert_or_contradictory_settings_are_errors_not_warnings(overrides, fragment):
    # data.path next to the explicit synthetic section: both set in the same overrides.
    raw = {"data": {}} if overrides[0].startswith("data.") else None
    extra = ["data.synthetic={}"] if raw is not None else []
    assert fragment in error_of(*overrides, *extra, raw=raw)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (
            ["data.quarantine_path=/tmp/q.parquet"],
            "data.quarantine_path has no effect with data.on_bad_rows=error (bad rows stop the "
            "run, nothing is quarantined): remove it, or set data.on_bad_rows=quarantine",
        ),
        (
            ["delivery.row_cache=false", "delivery.row_cache_dir=/tmp/rows"],
            "delivery.row_cache_dir has no effect with delivery.row_cache=false: remove it, or set "
            "delivery.row_cache=true",
        ),
    ],
)
def test_a_data_location_that_nothing_writes_is_refused_naming_the_key(overrides, fragment):
    assert fragment in error_of(*overrides)
    # the same location where it is used, and the modes left at their default null, are fine
    assert load("data.on_bad_rows=quarantine", "data.quarantine_path=/tmp/q.parquet")
    assert load("delivery.row_cache_dir=/tmp/rows").delivery_used.row_cache
    assert load(
        "delivery.row_cache=false", "data.quarantine_path=null", "delivery.row_cache_dir=null"
    )


def test_sections_are_discriminated_variants():
    assert isinstance(load().batching, TokenBudgetBatching)
    assert isinstance(load("batching.mode=fixed").batching, FixedBatching)
    assert isinstance(load().buckets, OptimisedBuckets) and load().buckets.edges is None
    assert isinstance(load("buckets.edges=[0, 64, 8192]").buckets, ExplicitBuckets)


def test_an_override_switches_a_section_variant_from_the_config_file(tmp_path):
    raw = tiny_raw(tmp_path)  # optimised buckets, token-budget batching, synthetic data
    cfg = validate(
        apply_overrides(
            raw,
            [
                "buckets.edges=[0, 32, 64]",
                "batching.mode=fixed",
                "batching.batch_size=8",
                "data.path=/data/shards",
            ],
        )
    )
    assert cfg.buckets.edges == [0, 32, 64]
    assert cfg.batching == FixedBatching(batch_size=8)
    assert cfg.data.path == "/data/shards" and cfg.data.synthetic is None
    back = validate(apply_overrides(cfg.model_dump(mode="json"), ["buckets.num_buckets=3"]))
    assert back.buckets == OptimisedBuckets(num_buckets=3)
    synth = validate(apply_overrides(cfg.model_dump(mode="json"), ["data.synthetic.seed=3"]))
    assert synth.data.path is None and synth.data.synthetic.seed == 3


def test_a_field_of_one_variant_switches_the_files_mode_to_it(tmp_path):
    raw = tiny_raw(tmp_path)
    raw["batching"] = {"mode": "packed", "row_tokens": 128, "rows_per_step": 2}
    padded = validate(apply_overrides(raw, ["batching.token_budget=1024"])).batching
    assert padded == TokenBudgetBatching(token_budget=1024)
    assert validate(apply_overrides(raw, ["batching.batch_size=8"])).batching == FixedBatching(
        batch_size=8
    )
    # Fields of two variants, or an explicit mode beside another variant's field: an error.
    for both in (
        ["batching.token_budget=1024", "batching.row_tokens=256"],
        ["batching.mode=packed", "batching.token_budget=1024"],
    ):
        with pytest.raises(ConfigError, match="batching.token_budget has no effect with batching"):
            validate(apply_overrides(raw, both))


@pytest.mark.parametrize(
    "raw, overrides, fragment",
    [
        ({}, [], "data: required section is missing: give data.path or a data.synthetic"),
        ({"data": {}}, [], "data: no data source: set data.path"),
        ({"data": {"path": None}}, [], "data: no data source"),
        (SYNTH, ["data.path="], "data.path is empty"),  # an unset shell variable
        ({"data": {"path": "/x"}}, ["data.path=  "], "data.path is empty"),
    ],
)
def test_the_synthetic_corpus_must_be_asked_for(raw, overrides, fragment):
    assert fragment in error_of(*overrides, raw=raw)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (
            ["batching.token_budget=4096"],
            "batching.token_budget=4096 is below data.max_length=8192",
        ),
        (
            ["buckets.edges=[0, 512, 2048]", "batching.token_budget=1024"],
            "batching.token_budget=1024 is below the top edge of buckets.edges (2048)",
        ),
    ],
)
def test_token_budget_below_the_top_edge_is_refused(overrides, fragment):
    msg = error_of(*overrides)
    assert fragment in msg and "raise batching.token_budget to >= " in msg


def test_token_budget_at_the_top_edge_is_fine():
    assert load("buckets.edges=[0, 512, 2048]", "batching.token_budget=2048").buckets.edges
    assert load("batching.mode=fixed", "batching.batch_size=1").batching.batch_size == 1


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.lr=.inf", "train.lr: Input should be a finite number"),
        ("train.lr=inf", "train.lr: Input should be a finite number"),
        ("train.lr=nan", "train.lr"),
        ("train.lr=0", "train.lr: Input should be greater than 0"),
        ("train.betas=[0.9, 1.0]", "train.betas.1: Input should be less than 1"),
        ("train.betas=[-0.1, 0.95]", "train.betas.0: Input should be greater than or equal to 0"),
        ("train.weight_decay=.inf", "train.weight_decay: Input should be a finite number"),
        ("train.weight_decay=-1", "train.weight_decay"),
        ("train.grad_clip=.nan", "train.grad_clip"),
    ],
)
def test_optimizer_settings_are_range_checked(override, fragment):
    assert fragment in error_of(override)


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "..", "-x", "x" * 129, "a b"])
def test_run_name_is_one_safe_path_component(name):
    assert "checkpoint.run_name=" in error_of(f"checkpoint.run_name={name}")


@pytest.mark.parametrize("name", ["dflash-902k", "run_1.2", "2024"])
def test_safe_run_names_pass(name):
    assert load(f"checkpoint.run_name={name}").checkpoint.run_name == name


def test_missing_config_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(None, ["train.lr"])
    with pytest.raises(ConfigError, match="train.lr.x: train.lr is not a section"):
        load_config(None, ["train.lr=1", "train.lr.x=2"])


def test_contract8_elastic_scaling_range():
    assert load("scaling.num_workers=4", "scaling.min_workers=2").scaling.ray_num_workers() == (
        2,
        4,
    )
    assert load("scaling.num_workers=4").scaling.ray_num_workers() == 4


def test_null_chooses_no_variant():
    # data.path=null is "no path": the config file's synthetic section stays.
    assert load("data.path=null").data.synthetic is not None
    assert "buckets.edges is null: leave it out" in error_of("buckets.edges=null")
