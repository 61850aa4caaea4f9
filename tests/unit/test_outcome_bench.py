"""The outcome benchmark's arithmetic: steps that fit a time budget, the summary per policy and
question, the tables rendered into BENCHMARKS.md's and the README's blocks (no training here)."""

from __future__ import annotations

import pytest

from bench import outcome_blocks as ob
from bench.outcome import summarize
from bench.tables import render


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
    assert "time" not in summarize(r)
    assert ob.time({"outcome": r}) == "| equal time |\n|---|\n| not measured |"


def test_the_tables_show_each_policy_as_measured_between_their_markers_and_nowhere_else():
    r = {"outcome": _results()}
    time = ob.time(r)
    assert "| held-out loss at 100 s (mean) |" in time.splitlines()[0]
    assert (
        "| packed rows (2,048 x 8; the demo default) | 2.00 (2.00, 2.00) | 50 s | 2.0500 |" in time
    )
    assert (
        "| random | 0.50 (0.50, 0.50) | 200 s | 2.5000 | 0.0000 | 2.5000 | 200 s (1/1 seeds) |"
        in time
    )
    opt = ob.optimisation(r)
    assert opt.index("| packed rows") < opt.index("| sorted-static")  # best first
    row = "| sorted-static (fixed batches, order shuffled) | 2.2500 | 0.1000 | 2.2000, 2.3000 |"
    assert row in opt
    ran = ob.ran(r)
    assert (
        "| `python -m bench.outcome` | today | n/a | 2 CPU cores | 10 / 2 | 100 | 3 | 25 | 0, 1 | 64 |"
        in ran
    )
    blocks = {
        n: (("outcome",), fn) for n, fn in [("outcome-time", ob.time), ("outcome-ran", ob.ran)]
    }
    doc = (
        "# Benchmarks\nprose\n<!-- outcome-ran:start -->\nold\n<!-- outcome-ran:end -->\n"
        "between\n<!-- outcome-time:start -->\nold\n<!-- outcome-time:end -->\nmore prose\n"
    )
    new = render(doc, r, blocks)
    assert new.startswith("# Benchmarks\nprose\n") and new.endswith("more prose\n")
    assert "old" not in new and "\nbetween\n" in new and time in new and ran in new


def test_the_readme_headline_has_each_policy_once_with_mean_and_spread():
    r = {"outcome": _results()}
    head = ob.headline(r)
    # packed's final losses 2.0 and 2.1 -> mean 2.05, half the spread 0.05 (also at the budget)
    assert (
        "| packed rows (2,048 x 8; the demo default) | 2.050 ± 0.050 (2 seeds) | 2.050 ± 0.050 (2 seeds) |"
        in head
    )
    assert "| random | 2.000 ± 0.000 (1 seeds) | 2.500 ± 0.000 (1 seeds) |" in head
    assert head.index("| packed rows") < head.index("| sorted-static")  # best first
    assert "| outcome | today | 2 CPU cores | 3 |" in head  # where the figures come from
    readme = "intro\n<!-- outcome:headline:start -->\n<!-- outcome:headline:end -->\nrest\n"
    new = render(readme, r, {"outcome:headline": (("outcome",), ob.headline)})
    assert new.startswith("intro\n") and new.endswith("rest\n") and head.strip() in new


def test_the_plot_draws_every_question_beside_the_json(tmp_path):
    from bench.outcome import LABELS
    from bench.plots import plot_outcome

    path = plot_outcome(_results(), tmp_path / "outcome.png", LABELS)
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_every_policy_gives_a_valid_config_and_windowed_ones_plan_their_windows(tmp_path):
    """Each policy's overrides validate against the demo config (packed ones without a batch
    size), and a windowed policy's epoch is cut into the windows its name says."""
    import numpy as np

    from bench.outcome import Corpus, _plans, corpus_index, policy_config
    from bench.outcome_policies import POLICIES
    from pipeline.core.epochs import epoch_windows, resolve_edges

    rng = np.random.default_rng(np.random.SeedSequence(7))
    lengths = rng.integers(8, 512, size=6000)
    held = type("Held", (), {"path": str(tmp_path)})()
    corpus = Corpus(np.arange(6000), lengths, None, held, 512, {})
    windows = {"auto_w4": 4, "auto_w16": 16, "packed_w16": 16}
    for name in POLICIES:
        cfg = policy_config(name, corpus=corpus, seed=0, epochs=1, eval_every=25, batch_size=64)
        packed = cfg.batching.mode == "packed"
        assert packed == ("batching.mode=packed" in POLICIES[name]), name
        if name in windows:
            plan = _plans(cfg, corpus, [int(e) for e in resolve_edges(cfg, lengths)])[0]
            cut = epoch_windows(cfg, corpus_index(corpus), 0)
            assert np.unique(cut).size == windows[name], name
            assert plan.window_steps.size > 2 and plan.window_steps[-1] == plan.num_steps
