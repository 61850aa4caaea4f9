"""The benchmarks' pure parts on tiny inputs: padding, recomposition, readability, a training run's
figures, and `python -m bench.padding` end to end at smoke scale."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import padding as padding_bench
from bench.common import machine_info
from bench.padding import BATCHINGS, padding_table, planning_costs
from bench.quality import (
    loss_readability,
    recomposition_section,
    recomposition_table,
    repeated_pair_share,
)
from bench.runs import run_summary
from bench.training import (
    DEFAULT_BATCHING,
    POLICIES,
    policy_overrides,
    scaled_edges,
    scaled_lengths,
)
from pipeline.core.buckets import assign
from pipeline.core.config import TEAM_EDGES, BatchingConfig, PlanConfig, load_config
from pipeline.core.frontier import recomposition_floor
from pipeline.core.plan import epoch_plan
from pipeline.core.synthetic import seed902k_lengths


@pytest.fixture(scope="module")
def lengths() -> np.ndarray:
    return seed902k_lengths(4_000, seed=0).astype(np.int64)


@pytest.fixture(scope="module")
def padding(lengths) -> dict:
    out = padding_table(lengths, ks=(6, 16))
    out["costs"] = planning_costs({"preset": lengths, "scaled": np.tile(lengths, 2)}, repeats=1)
    return out


def test_padding_table_ranks_sorted_first_random_last_at_every_batching(padding):
    for block in padding["batchings"].values():
        eff = {p["name"]: p["vs_sorted"] for p in block["policies"]}
        assert eff["sorted"] == 1.0
        assert min(eff, key=eff.get) == "random"
        assert eff["optimal:auto"] >= eff["optimal:6"]
        assert {"edges:team", "optimal:6", "optimal:16", "optimal:auto", "megabatch"} <= set(eff)
        # Every policy pads the same real tokens.
        assert len({p["real_tokens"] for p in block["policies"]}) == 1


def test_repeated_pair_share_by_hand():
    ids, off = np.arange(8), np.array([0, 4, 8])
    assert repeated_pair_share(ids, off, ids, off) == 1.0
    # Every new batch mixes the two old ones: no pair meets again.
    assert (
        repeated_pair_share(ids, off, np.array([0, 4, 1, 5, 2, 6, 3, 7]), np.array([0, 2, 4, 6, 8]))
        == 0.0
    )
    # {0,1,4,5} and {2,3,6,7}: two of six pairs met before in each batch.
    assert repeated_pair_share(ids, off, np.array([0, 1, 4, 5, 2, 3, 6, 7]), off) == pytest.approx(
        1 / 3
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chance_floor_predicts_a_fresh_shuffle(seed):
    """The analytic floor matches what a within-bucket reshuffle measures (within noise)."""
    from pipeline.core.metrics import batch_recomposition

    lengths = seed902k_lengths(20_000, seed=seed)
    b = BatchingConfig(mode="fixed", batch_size=32)
    plans = [
        epoch_plan(
            lengths, TEAM_EDGES, epoch=e, world_size=1, batching=b, plan=PlanConfig(seed=seed)
        )
        for e in (0, 1)
    ]
    (_, o0), (_, o1) = (p.micro_batch_lengths() for p in plans)
    measured = batch_recomposition(plans[0].sample_ids, o0, plans[1].sample_ids, o1)
    assert measured == pytest.approx(recomposition_floor(plans[1]), abs=0.06)


def test_recomposition_table_sorted_repeats_everything_random_almost_nothing(lengths):
    rows = {
        r["name"]: r
        for r in recomposition_table(lengths, {"edges:team": TEAM_EDGES}, BATCHINGS["B32"])
    }
    assert rows["sorted"]["recomposition"] == 1.0 and rows["sorted"]["repeated_pairs"] == 1.0
    assert rows["random"]["repeated_pairs"] < 0.02
    assert rows["edges:team"]["switch_rate"] == pytest.approx(
        rows["edges:team"]["switch_rate_expected"], abs=0.1
    )
    assert "megabatch" in rows


def test_loss_readability_sees_bucket_jumps():
    steps = np.arange(200)
    jumps = np.where(steps % 2, 1.0, 0.0)
    curves = {
        "loss": list(zip(steps.tolist(), (3 - steps / 200 + jumps).tolist(), strict=True)),
        "loss_debiased": list(zip(steps.tolist(), (3 - steps / 200).tolist(), strict=True)),
    }
    r = loss_readability(curves, skip=10)
    assert r["steps"] == 190 and r["ratio"] < 0.01


def test_team_edges_scale_with_the_lengths():
    lengths = scaled_lengths(20_000, 512)
    assert lengths.min() >= 2 and lengths.max() <= 512
    edges = scaled_edges(512)
    assert edges == [0, 48, 76, 108, 152, 206, 512]
    full = seed902k_lengths(20_000)
    same = assign(full, TEAM_EDGES) == assign(lengths, edges)
    assert same.mean() > 0.97  # rounding moves only samples next to an edge


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_override_is_a_valid_run_config(policy):
    batching = [f"batching.{k}={v}" for k, v in DEFAULT_BATCHING.items()]  # as measure_training
    cfg = load_config(
        "configs/local.yaml", ["data.max_length=512", *batching, *policy_overrides(policy, 512)]
    )
    expected = {"sorted": "sorted", "random": "random"}.get(policy, "bucketed")
    assert cfg.plan.policy == expected


def _fake_metrics(rng, steps: int, tok_s: float, buckets: int) -> list[dict]:
    """Per-step metric lines as train.log_every=1 writes them."""
    out = [{"step": 0, "epoch/steps": steps, "epoch/planned_padding_efficiency": 0.9}]
    out[0] |= {f"epoch/steps_per_bucket/{k}": 1 for k in range(buckets)}
    for s in range(1, steps + 1):
        k = int(rng.integers(buckets))
        out.append(
            {
                "step": s,
                "perf/step_s": 0.1,
                "data/real_tokens_per_s": tok_s,
                "data/padded_tokens_per_s": tok_s / 0.9,
                "data/wait_fraction": 0.01,
                "train/loss": 3 - s / steps + 0.1 * k,
                "train/loss_debiased": 3 - s / steps,
                "train/bucket": k,
                f"train/loss_by_bucket/{k}": 3 + 0.1 * k,
            }
        )
    return out


def test_run_summary_totals_tokens_over_timed_steps():
    rng = np.random.default_rng(0)
    s = run_summary(_fake_metrics(rng, 20, 1000.0, 3), warmup=2)
    assert s["timed_steps"] == 18 and s["steps"] == 20
    assert s["real_tokens_per_s"] == pytest.approx(1000.0)
    assert s["steps_per_s"] == pytest.approx(10.0)
    assert s["padding_efficiency"] == pytest.approx(0.9)
    assert s["num_buckets"] == 3


def test_recomposition_section_scores_the_padding_tables_edges(lengths, padding):
    q = recomposition_section(lengths, padding["batchings"])
    assert set(q["recomposition"]) == set(BATCHINGS) and q["samples"] == lengths.size
    b32 = q["recomposition"]["B32"]
    assert (
        b32["label"] == "micro-batch 32"
        and b32["auto_k"] == padding["batchings"]["B32"]["auto"]["k"]
    )
    assert [x["name"] for x in b32["rows"]][:3] == ["sorted", "random", "megabatch"]
    assert {"edges:team", "optimal:auto"} <= {x["name"] for x in b32["rows"]}
    assert q["recomposition"]["T64K"]["label"] == "token budget 65,536"


def test_python_m_bench_padding_quick_writes_its_json_with_where_it_ran_and_its_plots(tmp_path):
    out = tmp_path / "padding.json"
    r = padding_bench.main(["--quick", "--samples", "3000", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(r))  # the file is the result
    meta = r["meta"]
    assert meta["command"] == f"python -m bench.padding --quick --samples 3000 --out {out}"
    assert meta["machine"]["cores"] == machine_info()["cores"] and meta["date_utc"].endswith("UTC")
    assert len(meta["load_before"]) == 3 and meta["duration_s"] > 0
    assert set(r["padding"]) == {"samples", "tokens", "batchings", "budget", "hf_fidelity", "costs"}
    assert r["padding"]["samples"] == 3000 and set(r["quality"]["recomposition"]) == set(BATCHINGS)
    for png in ("padding.png", "recomposition.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
