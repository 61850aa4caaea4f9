"""A reference while training (eval.reference_run): read from a finished run's directory, and
each evaluation, the W&B metrics and the picture saying where the run stands at equal tokens."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pipeline.core.config import ConfigError
from pipeline.learn.logger import REAL_TOKENS, ListLogger
from pipeline.train.history import EvalHistory, StepHistory
from pipeline.train.reference import reference_curve, reference_lines, reference_metrics
from pipeline.train.run_picture import draw_run
from tests.unit import trainer_fixtures
from tests.unit.test_compare_runs import _loss, _run
from tests.unit.trainer_fixtures import Saver, batches_for, config, held_out_batches, trainer


def test_a_reference_is_its_held_out_curve_against_real_tokens(tmp_path):
    d = _run(tmp_path, "ref", step_tokens=1000, speed=1.0, digest="abc")
    ref = reference_curve(d, "abc")
    assert ref["name"] == "ref" and ref["warning"] == ""
    assert ref["tokens"][:3] == [0.0, 10_000.0, 20_000.0]
    np.testing.assert_allclose(ref["loss"], _loss(np.asarray(ref["tokens"]), 1.0))
    assert "another held-out set" in reference_curve(d, "xyz")["warning"]
    with pytest.raises(ConfigError, match="^eval.reference_run: no complete checkpoint under"):
        reference_curve(str(tmp_path / "nothing"))
    m = reference_metrics(ref, 15_000.0, 3.0)
    want = (_loss(np.array(10_000.0), 1.0) + _loss(np.array(20_000.0), 1.0)) / 2
    assert m["eval/reference_loss"] == pytest.approx(float(want))
    assert m["eval/vs_reference"] == pytest.approx(3.0 - float(want))
    assert reference_metrics(ref, 1e9, 3.0) == {}  # past the reference's last evaluation


def test_each_evaluation_says_where_the_run_stands_against_the_reference(
    tmp_path, monkeypatch, capsys
):
    ref = {"name": "old", "tokens": [0.0, 1e3, 1e6], "loss": [4.0, 3.5, 0.5], "warning": ""}
    plain = trainer_fixtures.spec
    monkeypatch.setattr(
        trainer_fixtures,
        "spec",
        lambda *a, **k: dataclasses.replace(plain(*a, **k), reference=ref),
    )
    cfg = config(tmp_path, eval={"path": "unused", "every_steps": 4, "at_start": True})
    t = trainer(tmp_path, cfg, Saver(tmp_path), eval_batches=held_out_batches())
    logger = ListLogger()
    assert t.fit(batches_for(), logger) == "done"
    evals = [m for _, m in logger.records if "eval/loss" in m]
    lines = [x for x in capsys.readouterr().out.splitlines() if " eval at step " in x]
    assert len(evals) == len(lines) >= 3
    for m, line in zip(evals, lines, strict=True):
        at = float(np.interp(m[REAL_TOKENS], ref["tokens"], ref["loss"]))
        assert m["eval/reference_loss"] == pytest.approx(at)
        assert m["eval/vs_reference"] == pytest.approx(m["eval/loss"] - at)
        word = "better" if m["eval/vs_reference"] < 0 else "worse"
        assert line.endswith(f"at the same tokens: {abs(m['eval/vs_reference']):.4f} {word}")
        assert f"| reference old {at:.4f}" in line


def test_the_picture_draws_the_reference_named_in_the_runs_config(tmp_path, monkeypatch):
    ref_dir = _run(tmp_path, "ref", step_tokens=1000, speed=1.0)
    run_dir = _run(tmp_path, "new", step_tokens=1000, speed=1.5)
    ck = next((tmp_path / "new").glob("checkpoint_step*"))
    (ck / "run_config.json").write_text(json.dumps({"eval": {"reference_run": ref_dir}}))
    from pipeline.train import run_picture

    seen = {}
    real = run_picture.draw_reference
    monkeypatch.setattr(
        run_picture, "draw_reference", lambda ax, a, r: seen.update(r) or real(ax, a, r)
    )
    assert draw_run(run_dir).endswith("run.png")
    assert seen["name"] == "ref"
    h, ev = StepHistory.read_dir(str(ck)), EvalHistory.read_dir(str(ck))
    lines = reference_lines(h.arrays(), ev.arrays(), seen)
    assert lines[0].startswith("reference ref: ") and lines[1].endswith("better")
