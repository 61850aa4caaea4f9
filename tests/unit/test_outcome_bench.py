"""The outcome benchmark's arithmetic: steps that fit a time budget, the summary per policy and
question, the tables rendered into BENCHMARKS.md's block (no training here)."""

from __future__ import annotations

import pytest

from bench.outcome import equal_time_steps, summarize
from bench.outcome_render import START, outcome_tables, replace_block


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
        "time": {
            "sorted": {"0": _run([3.0, 2.5, 2.2], 1e6, 100), "1": _run([3.0, 2.6, 2.3], 1e6, 100)},
            "packed": {"0": _run([3.0, 2.2, 2.0], 1e6, 110), "1": _run([3.0, 2.4, 2.1], 1e6, 110)},
        }
    }
    r = {
        "runs": runs,
        "throughput": {
            "sorted": {"s_per_real_token": 1e-4, "ratio_to_reference": [1.0, 1.0]},
            "packed": {"s_per_real_token": 0.5e-4, "ratio_to_reference": [0.5, 0.5]},
        },
        "command": "python -m bench.outcome",
        "date_utc": "today",
        "machine": "2 CPU cores",
        "corpus": {"train_samples": 10, "heldout_samples": 2},
        "heldout_tokens": 100,
        "epochs": 3,
        "eval_every": 25,
        "batch_size": 64,
        "time_budget_s": 100.0,
    }
    r["summary"] = summarize(r)
    return r


def test_steps_that_fit_a_time_budget():
    assert equal_time_steps([10, 10, 10, 10], 1.0, 25) == 2
    assert equal_time_steps([10, 10, 10, 10], 1.0, 40) == 4
    assert equal_time_steps([10, 10], 2.0, 19) == 0


def test_summary_has_mean_spread_and_the_time_to_sorted_static_loss():
    s = _results()["summary"]["time"]
    assert s["sorted"]["mean"] == pytest.approx(2.25)
    assert s["sorted"]["spread"] == pytest.approx(0.1)
    # sorted-static's mean final loss is 2.25: packed seed 0 reaches it at its 2nd evaluation
    # (0.5M tokens x 0.5e-4 s), seed 1 at its 3rd (1M tokens x 0.5e-4 s).
    assert s["packed"]["time_to_sorted_loss_s"] == pytest.approx([25.0, 50.0])
    assert s["sorted"]["time_to_sorted_loss_s"][1] is None  # seed 1 ends at 2.3 > 2.25


def test_the_tables_go_between_the_markers_and_nowhere_else():
    r = _results()
    tables = outcome_tables(r)
    assert "| packed rows (2,048 x 8) | 2.00 (2.00, 2.00) |" in tables
    doc = f"# Benchmarks\nhand-written prose\n{START}\nold\n<!-- outcome:end -->\nmore prose\n"
    new = replace_block(doc, tables)
    assert new.startswith("# Benchmarks\nhand-written prose\n") and new.endswith("more prose\n")
    assert "old" not in new and tables.strip() in new
    with pytest.raises(ValueError):
        replace_block("no markers", tables)
