"""The held-out loss by document length range: a run with one bucket (packed rows, or a baseline
batching across all lengths) splits its held-out loss by the same length ranges its training
loss is reported by, in the one all-reduced vector of each evaluation, and records it where its
run directory keeps its evaluations (checkpoints, async records), prints it (`jobs.evaluate`),
draws it (dots in the picture's length panel) and compares it (`jobs.compare_runs`); a bucketed
run keeps its per-bucket figures only."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.fs as pafs
import pytest
import torch

from pipeline.core.evaluation import EVAL_FIELDS, EvalSums, range_metric
from pipeline.core.length_ranges import range_label, run_ranges
from pipeline.data.evalset import rank_eval_batches
from pipeline.learn.evaluate import document_sums
from pipeline.learn.logger import ListLogger
from pipeline.train.evaluate_run import ASYNC_EVALS_DIR, checkpoint_ranges, read_async_evals
from pipeline.train.evaluation import Evaluator, evaluate_batches
from pipeline.train.history import EvalHistory, StepHistory
from tests.unit import trainer_fixtures
from tests.unit.test_evaluation import TOP, _eval_set, _model, _run_cfg
from tests.unit.test_length_ranges import _ranged_history, _with_ranges

CPU = torch.device("cpu")
PREFIX = "eval/loss_by_length/"


def test_eval_sums_by_range_are_the_per_document_sums_of_each_range():
    loss = np.array([10.0, 2.0, 30.0, 4.0, 7.0])
    tokens = np.array([10.0, 1.0, 10.0, 4.0, 0.0])  # the last supervises nothing
    lengths = np.array([12, 3, 50, 75, 20])  # 75: past the top edge, counts in the last range
    ranges = [0, 10, 40, 60]
    s = EvalSums.of_documents(loss, np.ones(5), tokens, lengths, [0, 60], ranges)
    # By hand: (0, 10] holds length 3; (10, 40] lengths 12 and 20; (40, 60] 50 and 75.
    np.testing.assert_array_equal(s.range_loss, [2.0, 17.0, 34.0])
    np.testing.assert_array_equal(s.range_tokens, [1.0, 10.0, 14.0])
    m = s.metrics()
    assert m["eval/loss_by_length/1-10"] == pytest.approx(2.0)
    assert m["eval/loss_by_length/11-40"] == pytest.approx(1.7)
    assert m["eval/loss_by_length/41-60"] == pytest.approx(34 / 14)
    # The ranges add up to the whole: every supervised token lies in exactly one range.
    assert s.range_loss.sum() == s.loss_sum and s.range_tokens.sum() == s.tokens
    # One vector per evaluation: the ranges ride behind the per-bucket sums.
    v = s.vector()
    assert v.size == len(EVAL_FIELDS) + 2 * 1 + 2 * 3
    assert EvalSums.from_vector(v, 1, ranges).metrics() == m
    # Added up as the all-reduce adds ranks: the sums of every document together.
    a = EvalSums.of_documents(loss[:2], np.ones(2), tokens[:2], lengths[:2], [0, 60], ranges)
    b = EvalSums.of_documents(loss[2:], np.ones(3), tokens[2:], lengths[2:], [0, 60], ranges)
    np.testing.assert_array_equal((a + b).vector(), v)


def test_every_range_is_reported_even_one_without_held_out_tokens():
    s = EvalSums.of_documents(
        np.array([3.0]), np.ones(1), np.array([3.0]), np.array([5]), [0, 64], [0, 10, 64]
    )
    m = s.metrics()
    assert m["eval/loss_by_length/1-10"] == pytest.approx(1.0)
    assert np.isnan(m["eval/loss_by_length/11-64"])


def test_sums_without_ranges_are_what_they_were():
    loss, tokens, lengths = np.array([10.0, 2.0]), np.array([10.0, 1.0]), np.array([12, 30])
    s = EvalSums.of_documents(loss, np.ones(2), tokens, lengths, [0, 16, 64])
    assert s.vector().size == len(EVAL_FIELDS) + 2 * 2
    assert not any(k.startswith(PREFIX) for k in s.metrics())
    with pytest.raises(ValueError, match="length ranges"):
        s + EvalSums.of_documents(loss, np.ones(2), tokens, lengths, [0, 16, 64], [0, 20, 64])


def _training_ranges() -> list[int]:
    """A packed run's ranges, cut from its training lengths as the driver cuts them."""
    lengths = np.random.default_rng(11).integers(1, TOP + 1, 2000)
    ranges = run_ranges(lengths, [0, TOP])
    assert len(ranges) == 5
    return ranges


@pytest.mark.parametrize("packed", [True, False])
def test_a_packed_runs_held_out_loss_by_range_is_each_documents_alone_on_any_world_size(packed):
    model, held = _model(2), _eval_set(90, seed=5)
    ranges = _training_ranges()
    # By hand: each held-out document on its own, its sums added to its length's range.
    want_loss, want_tokens = np.zeros(4), np.zeros(4)
    for i in range(held.num_samples):
        toks = torch.tensor(held.table["input_ids"][i].as_py())[None]
        with torch.no_grad():
            logits = model(toks, torch.ones_like(toks), torch.arange(toks.shape[1])[None])
        loss, _, tokens, length = document_sums(logits, toks, torch.ones_like(toks))
        r = int(np.searchsorted(ranges, int(length[0]), side="left")) - 1
        want_loss[r] += float(loss.sum())
        want_tokens[r] += float(tokens.sum())
    assert (want_tokens > 0).all()
    cfg = _run_cfg(packed)
    for world in (1, 3):
        total = EvalSums.zeros(1, ranges)
        for rank in range(world):
            batches = rank_eval_batches(cfg, held, top=TOP, rank=rank, world_size=world)
            total = total + evaluate_batches(
                model, batches(), edges=[0, TOP], device=CPU, ranges=ranges
            )
        np.testing.assert_allclose(total.range_loss, want_loss, rtol=1e-5)
        np.testing.assert_array_equal(total.range_tokens, want_tokens)
        m = total.metrics()
        labels = [range_label(ranges, r) for r in range(4)]
        assert sorted(k for k in m if k.startswith(PREFIX)) == sorted(PREFIX + x for x in labels)


def test_the_evaluator_reports_every_range_of_a_packed_run_and_none_for_a_bucketed_one():
    model, held = _model(3), _eval_set(40, seed=6)
    cfg = _run_cfg(True)
    batches = rank_eval_batches(cfg, held, top=TOP, rank=0, world_size=1)
    lengths = np.random.default_rng(1).integers(1, TOP + 1, 500)
    ranges = run_ranges(lengths, [0, TOP])
    m = Evaluator(cfg.eval, batches, edges=[0, TOP], device=CPU, ranges=ranges).run(model)
    got = [k for k in m if k.startswith(PREFIX)]
    assert got == [range_metric(ranges, r) for r in range(len(ranges) - 1)]
    assert all(np.isfinite(m[k]) for k in got)
    edges = [0, 16, 40, TOP]  # a bucketed run: its buckets are its length ranges
    assert run_ranges(lengths, edges) == []
    m = Evaluator(cfg.eval, batches, edges=edges, device=CPU, ranges=[]).run(model)
    assert not any(k.startswith(PREFIX) for k in m)
    assert any(k.startswith("eval/loss_by_bucket/") for k in m)


def _fit(tmp_path, ranges, monkeypatch):
    _with_ranges(monkeypatch, ranges)
    cfg = trainer_fixtures.config(tmp_path, eval={"path": "unused", "every_steps": 4})
    saver, logger = trainer_fixtures.Saver(tmp_path), ListLogger()
    t = trainer_fixtures.trainer(
        tmp_path, cfg, saver, eval_batches=trainer_fixtures.held_out_batches()
    )
    assert t.fit(trainer_fixtures.batches_for(), logger) == "done"
    return saver, [m for _, m in logger.records if "eval/loss" in m]


def test_a_run_with_ranges_records_its_held_out_loss_by_range_in_its_checkpoints(
    tmp_path, monkeypatch
):
    ranges = [0, 8, 16, 32]
    saver, logged = _fit(tmp_path, ranges, monkeypatch)
    labels = [range_label(ranges, r) for r in range(3)]
    assert logged and all({PREFIX + x for x in labels} <= m.keys() for m in logged)
    evals = saver.latest_evals()  # what the run directory keeps: read back from the parquet
    assert evals.range_edges == ranges
    by = evals.arrays()["loss_by_length"]
    assert by.shape == (len(logged), 3) and np.isfinite(by).all()
    np.testing.assert_allclose(by[-1], [logged[-1][PREFIX + x] for x in labels])
    assert saver.latest_history().range_edges == ranges  # the training loss's, the same


def test_a_run_without_ranges_records_none(tmp_path, monkeypatch):
    saver, logged = _fit(tmp_path, [], monkeypatch)
    assert logged and not any(k.startswith(PREFIX) for m in logged for k in m)
    evals = saver.latest_evals()
    assert evals.range_edges == [] and "loss_by_length" not in evals.arrays()
    assert "loss_by_length" not in evals.table().column_names


def test_an_eval_history_keeps_its_ranges_through_a_checkpoint_and_a_truncation(tmp_path):
    ranges = [0, 10, 20]
    ev = EvalHistory()
    for s in (0, 4, 8):
        m = {"eval/loss": 2.0, "eval/accuracy": 0.1, "eval/loss_per_sample": 2.0,
             "eval/tokens": 10.0, "eval/samples": 2.0, "eval/loss_by_length/1-10": 2.5 - s / 10,
             "eval/loss_by_length/11-20": 1.5}  # fmt: skip
        ev.append(s, 0, m, 1, 0.1, ranges)
    ev.write(str(tmp_path))
    back = EvalHistory.read_dir(str(tmp_path))
    assert back.range_edges == ranges
    np.testing.assert_allclose(
        back.arrays()["loss_by_length"], [[2.5, 1.5], [2.1, 1.5], [1.7, 1.5]]
    )
    back.truncate(4)
    assert back.arrays()["loss_by_length"].shape == (2, 2)


def test_async_evaluations_and_jobs_evaluate_use_the_runs_own_ranges(tmp_path):
    fs = pafs.LocalFileSystem()
    folder = tmp_path / ASYNC_EVALS_DIR
    folder.mkdir()
    record = {"step": 4, "epoch": 0, "eval/loss": 2.0, "eval/accuracy": 0.1,
              "eval/loss_per_sample": 2.0, "eval/tokens": 10.0, "eval/samples": 2.0,
              "eval/seconds": 1.0, "eval/loss_by_length/1-10": 2.5,
              "eval/loss_by_length/11-20": 1.5, "range_edges": [0, 10, 20]}  # fmt: skip
    (folder / "step_00000004.json").write_text(json.dumps(record))
    ev = read_async_evals(fs, str(tmp_path), 1)
    assert ev.range_edges == [0, 10, 20]
    np.testing.assert_allclose(ev.arrays()["loss_by_length"], [[2.5, 1.5]])
    # jobs.evaluate splits by the ranges the checkpoint's step history recorded.
    ck = tmp_path / "checkpoint_step00000004"
    ck.mkdir()
    StepHistory(range_edges=[0, 10, 20]).write(str(ck))
    assert checkpoint_ranges(str(ck)) == [0, 10, 20]
    StepHistory().write(str(ck))
    assert checkpoint_ranges(str(ck)) == []


def _ranged_evals(ranges, steps=(0, 10, 20, 30, 40)) -> EvalHistory:
    """Evaluations by `ranges`: range r's held-out loss 2.5 - step / 100 + r / 10."""
    ev = EvalHistory()
    for s in steps:
        m = {"eval/loss": 3.0 - s / 100, "eval/accuracy": 0.2, "eval/loss_per_sample": 3.0,
             "eval/tokens": 100.0, "eval/samples": 10.0}  # fmt: skip
        m.update({range_metric(ranges, r): 2.5 - s / 100 + r / 10 for r in range(len(ranges) - 1)})
        ev.append(s, 0, m, 1, 0.1, ranges)
    return ev


def test_the_picture_draws_each_ranges_held_out_loss_as_dots_by_the_training_ranges(
    tmp_path, monkeypatch
):
    from pipeline.train import run_picture

    h = _ranged_history()  # ranges [0, 60, 150, 300, 512]
    drawn = []
    real = run_picture.draw_range_evals
    monkeypatch.setattr(
        run_picture,
        "draw_range_evals",
        lambda ax, ev, edges, cmap: drawn.append((ax, edges)) or real(ax, ev, edges, cmap),
    )
    ev = _ranged_evals(h.range_edges)
    run_picture.draw_history(h, str(tmp_path / "run.png"), edges=[0, 512], evals=ev)
    ((ax, edges),) = drawn
    assert edges == h.range_edges
    dots = [ln for ln in ax.get_lines() if ln.get_marker() == "o" and ln.get_linewidth() == 0]
    dots = [ln for ln in dots if len(ln.get_xdata())]  # the legend's sample dot has none
    assert len(dots) == 4
    for r, ln in enumerate(dots):
        np.testing.assert_array_equal(ln.get_xdata(), [0, 10, 20, 30, 40])
        np.testing.assert_allclose(
            ln.get_ydata(), 2.5 - np.array([0, 10, 20, 30, 40]) / 100 + r / 10
        )
    lo, hi = ax.get_ylim()
    assert lo <= 2.1 and hi >= 2.6  # every trained evaluation's dot is inside the panel
    # The text panel: the last evaluation's loss of each range after the training loss.
    a, held = h.arrays(), ev.arrays()["loss_by_length"]
    text = "\n".join(run_picture._summary_lines(a, ev.arrays(), 1, [0, 512], h.range_edges,
                                                held=held))  # fmt: skip
    for r, label in enumerate(("1-60", "61-150", "151-300", "301-512")):
        assert f"{label} tok" in text and f"| {2.1 + r / 10:.3f}" in text, text
    # Evaluations recorded by other ranges (or none) draw no dots.
    drawn.clear()
    run_picture.draw_history(h, str(tmp_path / "run.png"), edges=[0, 512],
                             evals=_ranged_evals([0, 100, 512]))  # fmt: skip
    assert drawn == []


def test_jobs_evaluate_prints_every_range_in_the_runs_order():
    from types import SimpleNamespace

    from jobs.evaluate import _lines

    ranges = [0, 60, 150, 512]
    s = EvalSums.of_documents(np.array([6.0, 20.0, 9.0]), np.ones(3), np.array([3.0, 10.0, 3.0]),
                              np.array([40, 100, 400]), [0, 512], ranges)  # fmt: skip
    m = {**s.metrics(), "eval/seconds": 1.0}
    target = SimpleNamespace(uri="runs/r/checkpoint_step00000010", edges=[0, 512],
                             position=SimpleNamespace(steps_done=10, epoch=0))  # fmt: skip
    lines = [x.split() for x in _lines(m, target) if "loss_by_length" in x]
    assert lines == [
        ["eval/loss_by_length/1-60", "2.0000"],
        ["eval/loss_by_length/61-150", "2.0000"],
        ["eval/loss_by_length/151-512", "3.0000"],
    ]


def test_compare_runs_reads_an_async_runs_evaluations_by_range_up_to_its_checkpoint(tmp_path):
    from pipeline.train.compare_runs import RunCurves
    from pipeline.train.run_record import read_run

    rdir = tmp_path / "async"
    ck = rdir / "checkpoint_step00000020"
    ck.mkdir(parents=True)
    position = {"version": 1, "epoch": 0, "next_step": 20, "plan_hash": "x", "world_size": 1,
                "global_batch": {"buckets.edges": [0, 512]}, "steps_done": 20,
                "data_files": {}}  # fmt: skip
    (ck / "state.json").write_text(json.dumps({"version": 1, "position": position}))
    h = _ranged_history(20)
    h.write(str(ck))
    folder = rdir / ASYNC_EVALS_DIR
    folder.mkdir()
    for s in (10, 20, 30):  # step 30: an evaluation of a checkpoint the history lacks
        r = {"step": s, "epoch": 0, "eval/loss": 2.0, "eval/accuracy": 0.1,
             "eval/loss_per_sample": 2.0, "eval/tokens": 10.0, "eval/samples": 2.0,
             "eval/seconds": 1.0, "range_edges": h.range_edges}  # fmt: skip
        r.update({range_metric(h.range_edges, k): 2.0 + s / 100 + k / 10 for k in range(4)})
        (folder / f"step_{s:08d}.json").write_text(json.dumps(r))
    run = RunCurves(read_run(str(rdir)))
    assert run.run.evals.steps() == [10, 20] and run.length_edges == h.range_edges
    assert run.length_source == "length ranges"
    np.testing.assert_allclose(run.eval_by_length[:, 3], [2.4, 2.5])


def test_the_console_line_gives_each_ranges_held_out_loss_and_a_bucketed_run_none():
    from pipeline.train.evaluation import eval_line

    base = {
        "eval/loss": 2.5,
        "eval/loss_per_sample": 2.4,
        "eval/accuracy": 0.3,
        "eval/samples": 30,
        "eval/tokens": 900,
        "eval/seconds": 0.5,
    }
    plain = eval_line(10, 0, base)
    assert "by length" not in plain and plain.endswith("in 0.5 s")
    m = base | {PREFIX + "1-60": 2.4812, PREFIX + "61-150": float("nan"), PREFIX + "151-512": 2.1}
    line = eval_line(10, 0, m)
    assert line.startswith(plain)
    assert line.endswith(" | by length (tokens): 1-60 2.481, 61-150 -, 151-512 2.100")
