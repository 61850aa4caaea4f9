"""The outcome benchmark's arithmetic: steps that fit a time budget, the summary per policy and
question, the tables rendered into BENCHMARKS.md's block (no training here)."""

from __future__ import annotations

import pytest

from bench.outcome import summarize
from bench.outcome_render import START, outcome_headline, outcome_tables, replace_block


def _run(losses, tokens, steps):
    n = len(losses)
    return {
        "steps": steps,
        "real_tokens": tokens,
        "eval": {
            "step": [steps * i // (n - 1) for i in range(n)],
            "real_tokens": [tokens * i / (n - 1) for i in range(n)],
            "loss": losses,
            "loss_per_sample": [x - 0.1 for x in losses],
            "accuracy": [0.5] * n,
        },
    }


def _results():
    runs = {
        "optimisation": {
            "sorted": {"0": _run([3.0, 2.5, 2.2], 1e6, 100), "1": _run([3.0, 2.6, 2.3], 1e6, 100)},
            "packed": {"0": _run([3.0, 2.2, 2.0], 1e6, 110), "1": _run([3.0, 2.4, 2.1], 1e6, 110)},
            "random": {"0": _run([3.0, 2.5, 2.0], 1e6, 100)},
        }
    }
    r = {
        "runs": runs,
        "throughput": {
            "sorted": {"s_per_real_token": 1e-4, "ratio_to_reference": [1.0, 1.0]},
            "packed": {"s_per_real_token": 0.5e-4, "ratio_to_reference": [0.5, 0.5]},
            "random": {"s_per_real_token": 2e-4, "ratio_to_reference": [2.0, 2.0]},
        },
        "command": "python -m bench.outcome",
        "date_utc": "today",
        "machine": "2 CPU cores",
        "corpus": {"train_samples": 10, "heldout_samples": 2},
        "heldout_tokens": 100,
        "epochs": 3,
        "eval_every": 25,
        "batch_size": 64,
    }
    r["summary"] = summarize(r)
    return r


def test_equal_time_reads_each_curve_at_sorted_static_time_and_when_it_reaches_its_loss():
    s = _results()["summary"]
    assert s["optimisation"]["sorted"]["mean"] == pytest.approx(2.25)
    assert s["optimisation"]["sorted"]["spread"] == pytest.approx(0.1)
    t = s["time"]
    # The budget: sorted-static's 1M real tokens at 1e-4 s each.
    assert [row["budget_s"] for row in t.values()] == pytest.approx([100.0] * 3)
    assert t["sorted"]["loss"] == pytest.approx([2.2, 2.3])
    # Packed rows run twice as fast: their 3 epochs end at 50 s, before the budget, at their
    # final loss; they reach sorted-static's mean final 2.25 at the 2nd evaluation (0.5M tokens
    # x 0.5e-4 s) with seed 0 and at the 3rd with seed 1.
    assert t["packed"]["loss"] == pytest.approx([2.0, 2.1])
    assert t["packed"]["run_s"] == pytest.approx([50.0, 50.0])
    assert t["packed"]["time_to_sorted_loss_s"] == pytest.approx([25.0, 50.0])
    # Random runs at half the rate: at the budget it is at its middle evaluation (2.5), not at
    # its final 2.0, which it reaches at 200 s.
    assert t["random"]["loss"] == pytest.approx([2.5])
    assert t["random"]["time_to_sorted_loss_s"] == pytest.approx([200.0])
    assert t["sorted"]["time_to_sorted_loss_s"][1] is None  # seed 1 ends at 2.3 > 2.25


def test_without_a_throughput_there_is_no_equal_time_answer():
    r = _results()
    del r["throughput"]
    assert "time" not in summarize(r) and "At equal time" not in outcome_tables(r)


def test_the_tables_go_between_the_markers_and_nowhere_else():
    r = _results()
    tables = outcome_tables(r)
    assert (
        "| packed rows (2,048 x 8; the demo default) | 2.00 (2.00, 2.00) | 50 s | 2.0500 |"
        in tables
    )
    assert (
        "| random | 0.50 (0.50, 0.50) | 200 s | 2.5000 | 0.0000 | 2.5000 | 200 s (1/1 seeds) |"
        in tables
    )
    doc = f"# Benchmarks\nhand-written prose\n{START}\nold\n<!-- outcome:end -->\nmore prose\n"
    new = replace_block(doc, tables)
    assert new.startswith("# Benchmarks\nhand-written prose\n") and new.endswith("more prose\n")
    assert "old" not in new and tables.strip() in new
    with pytest.raises(ValueError):
        replace_block("no markers", tables)


def test_the_readme_headline_has_each_policy_once_with_mean_and_spread():
    r = _results()
    head = outcome_headline(r)
    # packed's final losses 2.0 and 2.1 -> mean 2.05, half the spread 0.05 (also at the budget)
    assert (
        "| packed rows (2,048 x 8; the demo default) | 2.050 ± 0.050 (2 seeds) | 2.050 ± 0.050 (2 seeds) |"
        in head
    )
    assert "| random | 2.000 ± 0.000 (1 seeds) | 2.500 ± 0.000 (1 seeds) |" in head
    assert head.index("| packed rows") < head.index("| sorted-static")  # best first
    readme = "intro\n<!-- outcome:headline:start -->\n<!-- outcome:headline:end -->\nrest\n"
    new = replace_block(readme, head, "outcome:headline")
    assert new.startswith("intro\n") and new.endswith("rest\n") and head.strip() in new
