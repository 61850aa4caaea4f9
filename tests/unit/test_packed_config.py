"""batching.mode=packed as a config: its validation (one-line refusals naming the fix), the one
place that plans it (`epoch_plan_for` packs the epoch, auto edges are one bucket), and its
epoch/* and data/* metrics."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.core.config import ConfigError, PackedBatching, validate
from pipeline.core.epochs import (
    epoch_plan_for,
    packed_epoch_metrics,
    packing_spec,
    resolve_edges,
    run_epoch_plans,
)
from pipeline.core.packing import PackingSpec, pack_epoch, packed_summary
from pipeline.learn.model_check import ModelBuildError
from pipeline.train.progress import packed_step_metrics
from pipeline.train.step import GroupStats

PACKED = {"mode": "packed", "row_tokens": 128, "rows_per_step": 4}


def _cfg(batching=None, **sections):
    raw = {
        "data": {"synthetic": {}, "max_length": 128},
        "batching": {**PACKED, **(batching or {})},
        "model": {"d_model": 32, "n_heads": 2},
        "train": {"epochs": 2},
        **sections,
    }
    return validate(raw)


def _index(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, 129, n)
    return SimpleNamespace(lengths=lengths, sample_ids=np.arange(n, dtype=np.int64) * 3 + 7)


def test_packed_mode_validates_with_its_defaults():
    b = validate({"data": {"synthetic": {}}, "batching": {"mode": "packed"}}).batching
    assert isinstance(b, PackedBatching)
    assert (b.row_tokens, b.rows_per_step, b.open_rows, b.balance_rows) == (8192, 8, 16, 512)
    assert b.attention_width is None


@pytest.mark.parametrize(
    ("batching", "sections", "says"),
    [
        ({"row_tokens": 130}, {}, "batching.row_tokens=130 is not a multiple of batching.pad_to_"),
        ({"row_tokens": 64}, {}, "batching.row_tokens=64 is below data.max_length=128"),
        ({"rows_per_step": 3}, {}, "batching.rows_per_step=3 is not divisible by the world size 2"),
        (
            {"rows_per_step": 4},
            {"scaling": {"num_workers": 4, "min_workers": 3}},
            "not divisible by the world size 3",
        ),
        ({"token_budget": 4096}, {}, "batching.token_budget has no effect with batching.mode=p"),
        ({"batch_size": 8}, {}, "batching.batch_size has no effect with batching.mode=packed"),
        ({"drop_remainder": True}, {}, "batching.drop_remainder has no effect with batching.mod"),
        ({}, {"plan": {"policy": "random"}}, "plan.policy=random plans padded batches, and"),
        ({}, {"plan": {"max_run": 2}}, "plan.max_run has no effect with batching.mode=packed"),
    ],
)
def test_packed_config_refusals_are_one_line_naming_the_fix(batching, sections, says):
    with pytest.raises(ConfigError) as e:
        _cfg(batching, **sections)
    msg = str(e.value)
    assert says in msg and "\n" not in msg


def test_packed_fields_are_refused_in_the_padded_modes():
    for mode in ({"token_budget": 4096}, {"mode": "fixed", "batch_size": 8}):
        with pytest.raises(ConfigError, match="batching.row_tokens has no effect outside batch"):
            validate({"data": {"synthetic": {}}, "batching": {**mode, "row_tokens": 8192}})


def test_epoch_plan_for_packs_the_epoch_from_the_config():
    cfg, index = _cfg(), _index()
    edges = resolve_edges(cfg, index.lengths)
    assert len(edges) == 2 and edges[-1] == int(index.lengths.max())  # auto: a full shuffle
    plan = epoch_plan_for(cfg, index, edges, 1, 2)
    spec = PackingSpec(row_tokens=128, rows_per_step=4, attention_width=6 * 32)
    assert packing_spec(cfg) == spec
    want = pack_epoch(
        index.lengths, edges, seed=0, epoch=1, world_size=2, spec=spec, sample_ids=index.sample_ids
    )
    assert plan.packed and plan.content_hash == want.content_hash
    np.testing.assert_array_equal(plan.sample_ids, want.sample_ids)
    np.testing.assert_array_equal(plan.rows.step_rows, want.rows.step_rows)
    assert np.array_equal(np.sort(plan.sample_ids), index.sample_ids)  # every sample once
    # The hash covers the packing: another window, another plan.
    other = epoch_plan_for(_cfg({"open_rows": 2}), index, edges, 1, 2)
    assert other.content_hash != plan.content_hash
    # Explicit edges pack within buckets; the run's epochs are all packed.
    bucketed = _cfg(buckets={"edges": [0, 32, 128]})
    plans = list(run_epoch_plans(bucketed, index, [0, 32, 128], 2))
    assert len(plans) == 2 and all(p.packed for p in plans)
    assert set(np.unique(plans[0].step_bucket)) == {0, 1}


def test_packed_epoch_metrics_are_the_plans_summary():
    cfg, index = _cfg(), _index()
    edges = resolve_edges(cfg, index.lengths)
    plan = epoch_plan_for(cfg, index, edges, 0, 2)
    want = pack_epoch(
        index.lengths,
        edges,
        seed=0,
        epoch=0,
        world_size=2,
        spec=packing_spec(cfg),
        sample_ids=index.sample_ids,
    )
    assert want.content_hash == plan.content_hash
    s = packed_summary(want)
    m = packed_epoch_metrics(plan)
    assert m["epoch/rows"] == s["rows"] and m["epoch/row_fill"] == pytest.approx(s["row_fill"])
    assert m["epoch/planned_padding_efficiency"] == m["epoch/row_fill"]
    assert m["epoch/rank_max_over_mean"] == pytest.approx(s["rank_max_over_mean"])
    assert m["epoch/useful_over_paid"] == pytest.approx(s["useful_over_paid"])
    assert m["epoch/docs_per_row"] == pytest.approx(s["docs_per_row"])
    padded = validate({"data": {"synthetic": {}}})
    assert packed_epoch_metrics(epoch_plan_for(padded, index, [0, 128], 0, 2)) == {}


def test_packed_step_metrics_count_rows_documents_and_fill():
    stats = GroupStats(
        steps=[3],
        buckets=[0],
        loss_sum=np.array([1.0]),
        correct=np.array([1.0]),
        tokens=np.array([10.0]),
        real=np.array([384.0]),
        padded=np.array([512.0]),  # 4 rows of 128 over all ranks
        samples=np.array([10.0]),
    )
    m = packed_step_metrics(stats, 128)
    assert m == {"data/rows": 4.0, "data/docs_per_row": 2.5, "data/row_fill": 0.75}


def make_unaware(config: dict):
    """A model that reads attention_mask as a padding mask (no supports_packed)."""
    import torch

    return torch.nn.Sequential(torch.nn.Embedding(config["vocab_size"], 4))


def test_the_trainer_refuses_a_model_that_does_not_attend_within_documents(tmp_path):
    from pipeline.train.trainer import Trainer
    from tests.unit import trainer_fixtures as tf

    base = tf.config(tmp_path).model_dump()
    packed = {**base, "batching": {"mode": "packed", "row_tokens": 8192, "rows_per_step": 2}}
    mine = {**packed, "model": {**base["model"], "name": f"{__name__}:make_unaware"}}
    with pytest.raises(ModelBuildError, match="batching.mode=packed needs a model that attends"):
        Trainer(validate(mine), tf.spec(tmp_path), save=lambda *a: None)
    trainer = Trainer(validate(packed), tf.spec(tmp_path), save=lambda *a: None)
    assert trainer.row_tokens == 8192  # the tiny decoder attends within documents
