"""Full batches under a token budget (bench.fullbatch): the budget table's rows and relations, and
the Hugging Face samplers' simulation."""

from __future__ import annotations

import numpy as np

from bench.fullbatch import budget_table, hf_fidelity
from pipeline.core.synthetic import seed902k_lengths


def test_budget_table_rows_fill_the_budget_and_keep_within_it():
    lengths = seed902k_lengths(20_000, seed=1)
    t = budget_table(lengths, budget=32_768, k=8, world_sizes=(1, 4), repeats=1)
    for world, rows in t["worlds"].items():
        by = {r["name"]: r for r in rows}
        ref = rows[0]
        assert ref["steps_vs_reference"] == 1.0 and ref["over_budget_steps"] == 0
        before, after = by["bucketray K=8, before"], by["bucketray K=8, after"]
        assert after["fill"] > before["fill"] and after["steps"] < before["steps"]
        for r in rows:
            if r["name"].startswith(("bucketray", "sorted")):
                assert r["over_budget_steps"] == 0 and r["max_step_over_budget"] <= 1.0
        if world == "4":
            assert by["bucketray K=8, after, round_to=4"]["max_micro_over_share"] <= 1.0
    assert len(t["epochs"]) == 3
    fid = hf_fidelity(lengths[:4000], per_device=8, world_sizes=(1,), rebalance_samples=0)
    (row,) = fid["rows"]
    assert row["world_size"] == 1 and 0 < row["simulated"] <= 1
    if fid["available"]:  # transformers installed: the simulation is held to the real sampler
        assert abs(row["real"] - row["simulated"]) < 0.005
    assert np.isfinite([r["fill"] for r in t["worlds"]["1"]]).all()
