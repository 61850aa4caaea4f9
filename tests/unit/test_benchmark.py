"""Benchmark suite: the pure sections on tiny inputs, and the document rendered from them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from bench.padding import BATCHINGS, padding_table, planning_costs
from bench.plots import plot_all
from bench.quality import (
    expected_recomposition,
    loss_readability,
    recomposition_table,
    repeated_pair_share,
)
from bench.render import render_headline, render_markdown
from bench.suite import SuiteOptions, machine_info, section_gpu, section_quality
from bench.training import (
    POLICIES,
    aggregate_runs,
    policy_overrides,
    run_summary,
    scaled_edges,
    scaled_lengths,
)
from jobs.benchmark import build_parser, options
from pipeline.core.buckets import assign
from pipeline.core.config import TEAM_EDGES, BatchingConfig, PlanConfig, load_config
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
    assert measured == pytest.approx(expected_recomposition(plans[1]), abs=0.06)


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
    cfg = load_config("configs/local.yaml", ["data.max_length=512", *policy_overrides(policy, 512)])
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


def _fake_training(rng) -> dict:
    speeds = {"sorted": 1000.0, "random": 400.0, "edges:team": 800.0, "optimal:auto": 950.0}
    k = {"sorted": 1, "random": 1, "edges:team": 6, "optimal:auto": 12}
    runs = {
        p: [
            run_summary(_fake_metrics(rng, 30, v, k[p]))
            | {"wall_s": 1.0, "samples": 100, "tokens": 9}
            for _ in range(2)
        ]
        for p, v in speeds.items()
    }
    pol = {p: aggregate_runs(runs[p], runs["sorted"]) for p in speeds}
    return {
        "num_samples": 100,
        "max_length": 512,
        "scale": 512 / 8192,
        "batching": {"mode": "fixed", "batch_size": 32},
        "team_edges_scaled": scaled_edges(512),
        "repeats": 2,
        "warmup_steps_excluded": 2,
        "config": "configs/local.yaml",
        "model": {"n_layers": 2, "d_model": 128, "vocab_size": 512},
        "shared_overrides": ["train.epochs=1"],
        "policy_overrides": {p: policy_overrides(p, 512) for p in speeds},
        "policies": pol,
        "readability": {
            p: loss_readability(pol[p]["curves"], skip=5) for p in ("edges:team", "optimal:auto")
        },
    }


def _fake_delivery() -> dict:
    keys = ("ray_tokens_per_s_per_consumer", "ray_tokens_per_s_total", "baseline_tokens_per_s")
    run = {k: 1e8 for k in keys} | {
        "num_samples": 5000,
        "num_tokens": 5_000_000,
        "repeats": 1,
        "prepare_wall_s": 2.0,
        "row_cache": True,
        "prepare_first_s": 5.0,
        "prepare_later_s": 1.5,
        "plan_s": 0.01,
        "sort_s": 1.5,
        "split_s": 0.1,
        "index_s": 1.0,
        "index_cached_s": 0.05,
        "generate_s": 0.0,
    }
    chapter = {
        "first_step_s": 1.0,
        "epoch_s": 2.0,
        "peak_object_store_bytes": 4e7,
        "feeder_peak_held_bytes": 2e7,
        "num_tokens": 5_000_000,
    }
    run["chapters"] = [
        chapter | {"chapter_tokens": None, "chapters": 1},
        chapter | {"chapter_tokens": 2**20, "chapters": 5},
    ]
    side = {
        "first_step_s": 2.0,
        "start_step": 40,
        "first_range": {"start_step": 0, "end_step": 3, "tokens": 30_000, "in_feeder": True},
        "consumer_tokens_per_s": 2e8,
        "prepare_tokens_per_s": 3e7,
        "wait_fraction": 0.5,
        "peak_object_store_bytes": 4e7,
        "max_range_bytes": 2e7,
        "feeder_peak_rss_bytes": 3e8,
        "driver_peak_rss_bytes": 4e8,
        "feeder_peak_private_bytes": 1e8,
    }
    first = {
        "num_samples": 5000,
        "num_tokens": 5_000_000,
        "chapter_tokens": 2**21,
        "lead_tokens": 2**15,
        "chapters": 3,
        "chapters_run": 2,
        "index_build_s": 1.0,
        "cold": side | {"range_reads": [{"rg_parquet": 8, "rg_filled": 0}] * 2},
        "warm": side
        | {"consumer_tokens_per_s": 3e8, "range_reads": [{"rg_parquet": 0, "rg_filled": 0}]},
        "resume": side,
        "row_cache": True,
        "row_groups": 8,
        "row_cache_bytes": 2.5e7,
        "first_step_cold_s": [4.0, 1.0, 2.0, 3.0],
        "first_step_resume_s": [2.0],
        "reads": {"chapters_amplification": 3.0, "with_lead_in_amplification": 4.5},
    }
    big = first | {"num_samples": 10_000, "num_tokens": 10_000_000}
    big |= {"row_cache": False, "warm": None, "first_step_cold_s": [2.0]}
    big["cold"] = side | {"peak_object_store_bytes": 5e7}
    # measure_chapters at a larger corpus (suite option chapter_samples), with RSS and a spill
    at_size = chapter | {
        "num_samples": 10_000,
        "num_tokens": 10_000_000,
        "feeder_peak_rss_bytes": 5e8,
        "driver_peak_rss_bytes": 6e8,
    }
    chapters = [
        at_size
        | {"chapter_tokens": None, "chapters": 1, "peak_object_store_bytes": 1.2e8}
        | {"spilled_bytes": 3e7},
        at_size | {"chapter_tokens": 2**21, "chapters": 5, "peak_object_store_bytes": 4.4e7},
    ]
    return {"runs": {"5000": run}, "chapters": chapters, "first_steps": [first, big]}


@pytest.fixture(scope="module")
def results(lengths, padding, tmp_path_factory) -> dict:
    rng = np.random.default_rng(0)
    opts = SuiteOptions.quick_variant(samples=lengths.size)
    r = {
        "meta": {
            "command": "python -m jobs.benchmark --quick",
            "date_utc": "2026-01-01 00:00 UTC",
            "machine": machine_info(),
            "load_before": [1.0, 1.0, 1.0],
            "load_after": [1.0, 1.0, 1.0],
            "options": opts.__dict__,
            "skipped": [],
            "duration_s": 60.0,
        },
        "padding": padding,
        "quality": section_quality(lengths, padding),
        "training": _fake_training(rng),
        "delivery": _fake_delivery(),
        "gpu": section_gpu(str(tmp_path_factory.mktemp("gpu") / "absent.jsonl")),
    }
    r["plots"] = plot_all(r, tmp_path_factory.mktemp("plots"))
    return r


def test_markdown_has_every_table_and_no_placeholder(results, tmp_path):
    doc = render_markdown(
        results, doc_path=str(tmp_path / "BENCHMARKS.md"), json_path=str(tmp_path / "r.json")
    )
    # Headline first, then the four sections in order.
    heads = [h for h in re.findall(r"^#+ (.+)$", doc, flags=re.M)]
    assert heads[:2] == ["Benchmarks", "Headline"]
    order = [next(i for i, h in enumerate(heads) if h.startswith(f"{n}.")) for n in (1, 2, 3, 4)]
    assert order == sorted(order)
    headline = doc.split("## Headline")[1].split("##")[0]
    assert "| policy | padding eff. vs sorted" in headline
    for name in ("sorted-static", "random", "team's six edges", "optimal edges, auto"):
        assert name in headline
    assert (
        doc.count("|---|") >= 8
    )  # headline, 2x padding, costs, training, GPU, 2x recomposition, ...
    for bad in ("nan", "None", "TODO", "XXX", "{", "}"):
        assert bad not in doc.replace("`{", "").replace("}`", ""), bad
    assert "python -m jobs.benchmark --quick" in doc
    assert "| 5.0 / 1.5 |" in doc  # the first epoch's preparation (fills the row cache), later
    assert "| 5,000 | whole epoch | 1 |" in doc and "| 5,000 | 1,048,576 | 5 |" in doc
    # memory against corpus size, whole and in chapters, with the feeder's and driver's RSS
    assert "| 10,000 | whole epoch | 1 | 1.0 | 2.0 | 120 | 30 | 20 | 500 / 600 |" in doc
    assert "| 10,000 | 2,097,152 | 5 | 1.0 | 2.0 | 44 | 0 | 20 | 500 / 600 |" in doc
    assert (
        "Whole epoch: from 5,000 to 10,000 samples (2.0x the tokens) the object-store peak "
        "grew 3.0x, to 120 MB (30 MB spilled)." in doc
    )
    assert (
        "At 10,000 samples, chapters of 2,097,152 tokens peaked at 44 MB, 0.37 of the whole " in doc
    )
    assert (
        "At 5,000 samples, chapters of 1,048,576 tokens peaked at 40 MB, 1.00 of the whole " in doc
    )
    # time to the first step: cold on the empty row cache (first range read in the feeder),
    # cold on the filled one (median, range), after a restart; rates from the filled-cache run
    assert (
        "| 5,000 | 5 M | 2 of 3 | 1.0 | 4.0 (30,000 tok, feeder) | 2.0 (1.0-3.0, 3 runs) | "
        "2.0 (30,000 tok, step 40) | 300 | 30.0 | 50% | 40 | 20 | 300 (100) / 400 | 2.00 / 0.00 | "
        "0.03 | 3.00x / 4.50x |" in doc
    )
    # without the row cache: no empty-cache column, no decodes recorded, rates from the cold run
    assert "| 10,000 | 10 M | 2 of 3 | 1.0 | off | 2.0 | 2.0 (30,000 tok, step 40) | 200 |" in doc
    assert "| 300 (100) / 400 | - / - | off | 3.00x / 4.50x |" in doc
    assert (
        "object-store peak grew 1.2x, the feeder's RSS peak 1.0x (its private memory 1.0x;" in doc
    )
    assert "load average" in doc
    for p in results["plots"]:
        assert p.endswith(".png")
    assert {"padding", "training", "loss", "recomposition"} <= {
        p.rsplit("/", 1)[1][:-4] for p in results["plots"]
    }
    json.dumps(results)  # the JSON file is the same dict
    head = render_headline(results, doc_path="BENCHMARKS.md")
    assert "| policy | padding eff. vs sorted" in head and "(BENCHMARKS.md)" in head


def test_cli_options_quick_full_and_skips():
    args = build_parser().parse_args(["--quick", "--full", "--skip-training"])
    o = options(args)
    assert o.quick and not o.training and o.delivery
    assert o.delivery_samples[-1] == 902_087
    assert options(build_parser().parse_args([])).train_repeats == 3


@pytest.mark.slow
@pytest.mark.ray
def test_quick_benchmark_writes_document_json_and_plots(tmp_path):
    """`python -m jobs.benchmark --quick` end to end: every section at smoke scale (~2 min)."""
    from jobs.benchmark import main

    out, js, plots = tmp_path / "B.md", tmp_path / "r.json", tmp_path / "plots"
    argv = ["--quick", "--out", str(out), "--json", str(js), "--plots", str(plots)]
    readme = Path(__file__).parents[2] / "README.md"
    before = readme.read_text()
    assert main([*argv, "--work-dir", str(tmp_path / "work")]) == 0
    assert readme.read_text() == before  # only `make bench` (--readme README.md) rewrites it
    doc, results = out.read_text(), json.loads(js.read_text())
    assert set(results) >= {"meta", "padding", "quality", "training", "delivery", "gpu", "plots"}
    assert len(results["training"]["policies"]) == len(POLICIES)
    assert "## 4. Pipeline delivery" in doc and "Skipped" not in doc
    assert sorted(p.name for p in plots.iterdir()) == [
        "headline.md",
        "loss.png",
        "padding.png",
        "realtext_bucket_loss.png",
        "recomposition.png",
        "training.png",
    ]
    assert "**Real text**" in doc and results["training"]["realtext"]["steps"] > 0
    # Re-rendering from the JSON measures nothing and gives the same document.
    assert main([*argv, "--from-json", str(js)]) == 0
    assert out.read_text() == doc


def test_readme_headline_block_is_replaced_between_markers_only():
    from jobs.benchmark import HEADLINE_END, HEADLINE_START, splice_headline

    text = f"intro\n{HEADLINE_START}\nold table\n{HEADLINE_END}\nrest\n"
    out = splice_headline(text, "| new | table |\n")
    assert out == f"intro\n{HEADLINE_START}\n| new | table |\n{HEADLINE_END}\nrest\n"
    assert splice_headline("no markers here", "x") is None
    assert build_parser().parse_args([]).readme is None  # trial runs never touch the README
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert HEADLINE_START in readme and HEADLINE_END in readme


def test_the_readme_headline_states_the_real_text_and_the_synthetic_readability(results):
    from tests.unit.test_realtext_bench import _fake_result

    rt = _fake_result()
    r = {**results, "training": {**results["training"], "realtext": rt}}
    head = render_headline(r, doc_path="BENCHMARKS.md")  # what --readme README.md splices in
    real = f"{rt['readability']['ratio']:.2f} on the Python {rt['corpus']['python']} standard"
    syn = results["training"]["readability"]["optimal:auto"]["ratio"]
    assert real in head and f"{syn:.2f} on the synthetic corpus" in head
    assert "on the Python" not in render_headline(results, doc_path="BENCHMARKS.md")


def test_a_whole_epoch_left_out_at_a_larger_corpus_is_said_with_its_size():
    from bench.render import whole_epoch_not_run

    whole = {"chapter_tokens": None, "num_samples": 1000}
    first = [{"num_samples": 1000, "num_tokens": 10**9}, {"num_samples": 2000, "num_tokens": 2e9}]
    assert whole_epoch_not_run([whole], first) == [
        "The whole epoch was not run at 2,000 samples: that epoch and the next, prefetched, "
        "would hold up to 16.0 GB of int32 token ids in the object store at once; it is left "
        "out to keep `make bench` within the machine's memory.",
        "",
    ]
    assert whole_epoch_not_run([whole], first[:1]) == []
    assert whole_epoch_not_run([], first) == []
