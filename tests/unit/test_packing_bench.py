"""The on-paper packing benchmark: its pair-repeat estimate and its table on a small preset."""

from __future__ import annotations

import numpy as np

from bench.packing import packing_table, pair_repeat
from pipeline.core.synthetic import seed902k_lengths


def test_pair_repeat_is_one_for_frozen_steps_and_near_chance_for_independent_ones():
    rng = np.random.default_rng(0)
    steps = np.repeat(np.arange(200), 10)
    frozen = pair_repeat(steps, steps, pairs=5_000)
    assert frozen["rate"] == 1.0
    assert frozen["chance"] == (200 * 10 * 9) / (2000 * 1999)
    other = pair_repeat(steps, rng.permutation(steps), pairs=50_000)
    assert abs(other["rate"] - other["chance"]) < 5 * np.sqrt(other["chance"] / 50_000)


def test_the_table_scores_padded_and_packed_policies_at_each_world_size():
    t = packing_table(seed902k_lengths(3000), world_sizes=(1, 4), rows_per_step=4, pairs=2000)
    names = [r["name"] for r in t["rows"]]
    assert any("sorted-static" in n for n in names) and any("balanced" in n for n in names)
    by = {r["name"]: r for r in t["rows"]}
    sorted_ = next(v for k, v in by.items() if "sorted-static" in k)
    assert sorted_["pair_repeat"]["rate"] == 1.0  # the same batches every epoch
    balanced = by["packed: full shuffle, balanced"]["by_world_size"][4]
    unbalanced = by["packed: full shuffle, rows in packing order"]["by_world_size"][4]
    assert balanced["max_over_mean"] < unbalanced["max_over_mean"]
    for r in t["rows"]:
        assert r["by_world_size"][1]["max_over_mean"] == 1.0
        assert 0 < r["by_world_size"][4]["useful_over_paid"] <= 1
    assert t["pack_epoch_s"] == sorted(t["pack_epoch_s_all"])[1]  # the median of three epochs
