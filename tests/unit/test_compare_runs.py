"""Runs compared at equal tokens and time from their run directories alone: the standing, the
verdict's sign and size, the warnings on different held-out sets or models, each length range's
held-out difference (or why there is none), JSON and picture."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jobs.compare_runs import main as compare_runs
from pipeline.core.compare import Curve, reached_at, standing
from pipeline.core.length_ranges import range_label
from pipeline.train.history import EvalHistory, StepHistory

PNG = b"\x89PNG\r\n\x1a\n"


def _loss(tokens: np.ndarray, speed: float) -> np.ndarray:
    """A held-out curve falling with tokens; `speed` > 1 learns faster per token."""
    return 2.0 + 2.0 * np.exp(-speed * tokens / 4e5)


def _by_length(y: float, ranges, offsets, edges) -> dict:
    """The per-length held-out figures of an evaluation whose loss is `y`: each length range's
    (one bucket, `ranges`) or each bucket's (several, `edges`), `y` plus the range's offset."""
    if ranges:
        return {
            f"eval/loss_by_length/{range_label(ranges, r)}": y + o for r, o in enumerate(offsets)
        }
    if len(edges) > 2:
        return {f"eval/loss_by_bucket/{k}": y + o for k, o in enumerate(offsets)}
    return {}


def _run(tmp_path, name, *, step_tokens, speed, step_s=0.5, digest="d1", model=None, steps=80,
         ranges=(), edges=(0, 512), offsets=()):  # fmt: skip
    """A run directory with one complete checkpoint: history, evaluations, config, held-out.
    With `ranges` (one bucket) or several bucket `edges`, each evaluation records its held-out
    loss by length too: the run's loss plus each range's (or bucket's) `offsets`."""
    rdir = tmp_path / name
    ck = rdir / f"checkpoint_step{steps:08d}"
    ck.mkdir(parents=True)
    position = {"version": 1, "epoch": 0, "next_step": steps, "plan_hash": "x", "world_size": 1,
                "global_batch": {"buckets.edges": list(edges)}, "steps_done": steps,
                "data_files": {}}  # fmt: skip
    (ck / "state.json").write_text(json.dumps({"version": 1, "position": position}))
    (ck / "run_config.json").write_text(json.dumps({"model": model or {"d_model": 128}}))
    h, ev = StepHistory(), EvalHistory()
    rng = np.random.default_rng(len(name))
    for s in range(1, steps + 1):
        y = float(_loss(np.array(s * step_tokens), speed)) + rng.normal(0, 0.02)
        h.append(step=s, epoch=0, bucket=0, loss=y, debiased=y, lr=1e-3, real=step_tokens,
                 padded=step_tokens, seconds=step_s)  # fmt: skip
    for s in range(0, steps + 1, 10):
        y = float(_loss(np.array(s * step_tokens), speed))
        ev.append(s, 0, {"eval/loss": y, "eval/accuracy": 0.3, "eval/loss_per_sample": y,
                         "eval/tokens": 1e4, "eval/samples": 100.0,
                         **_by_length(y, ranges, offsets, edges)},
                  len(edges) - 1, 1.0, ranges)  # fmt: skip
    h.write(str(ck))
    ev.write(str(ck))
    if digest is not None:
        (rdir / "heldout.json").write_text(json.dumps({"digest": digest}))
    return str(rdir)


def test_a_curve_is_read_between_its_evaluations_and_never_past_them():
    c = Curve.of([0, 10, 20], [4.0, 3.0, 2.0])
    assert c.at(15) == 2.5 and np.isnan(c.at(21))
    ref = Curve.of([0, 10, 30], [4.0, 3.5, 2.5])
    s = standing(c, ref)
    assert s.at == 20 and s.run == 2.0 and s.reference == pytest.approx(3.0) and s.diff < 0
    assert reached_at(c, 2.5) == 15.0 and np.isnan(reached_at(c, 1.0))


def test_the_faster_run_is_better_at_equal_tokens_and_reaches_the_loss_sooner(tmp_path, capsys):
    fast = _run(tmp_path, "fast", step_tokens=16384, speed=1.5)
    slow = _run(tmp_path, "slow", step_tokens=8192, speed=1.0, step_s=0.3)
    out = tmp_path / "cmp.json"
    assert compare_runs([fast, slow, "--json", str(out), "--out", str(tmp_path / "c.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("fast against slow: held-out") and " better (" in lines[0]
    assert "sooner" in lines[0] and not any(x.startswith("warning") for x in lines)
    c = json.loads(out.read_text())["comparisons"][0]
    last = 80 * 8192  # the slow run's last evaluation: the last common token count
    tok = c["equal_tokens"]
    assert tok["at"] == last
    want = _loss(np.array(last), 1.5) - _loss(np.array(last), 1.0)
    assert tok["diff"] == pytest.approx(float(want), abs=2e-3)
    assert c["reach"]["tokens_ratio"] < 1
    assert (tmp_path / "c.png").read_bytes().startswith(PNG)
    # Measured the other way round, the same gap with the other sign.
    assert compare_runs([slow, fast, "--json", str(out)]) == 0
    back = json.loads(out.read_text())["comparisons"][0]["equal_tokens"]
    assert back["diff"] == pytest.approx(-tok["diff"], abs=1e-9)
    assert "worse" in capsys.readouterr().out.splitlines()[0]


def test_different_held_out_sets_or_models_are_compared_with_a_warning(tmp_path, capsys):
    a = _run(tmp_path, "a", step_tokens=16384, speed=1.2)
    b = _run(tmp_path, "b", step_tokens=16384, speed=1.0, digest="other")
    c = _run(tmp_path, "c", step_tokens=16384, speed=1.0, model={"d_model": 256})
    d = _run(tmp_path, "d", step_tokens=16384, speed=1.0, digest=None)
    assert compare_runs([a, b, c, d]) == 0
    out = capsys.readouterr().out
    assert "a against b:" in out and "different held-out sets" in out
    assert "train different models (model.d_model)" in out
    assert "d has no held-out record" in out


def test_compare_runs_refuses_what_it_cannot_read_in_one_line(tmp_path, capsys):
    a = _run(tmp_path, "a", step_tokens=16384, speed=1.2)
    assert compare_runs([a]) == 2
    assert compare_runs([a, str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: no complete checkpoint under")


RANGES = [0, 60, 150, 300, 512]  # a packed run's length ranges (pipeline.core.length_ranges)


def test_compare_runs_gives_each_length_range_its_held_out_difference_with_its_sign(
    tmp_path, capsys
):
    # The measured run learns faster overall but is worse on the longest documents.
    run = _run(tmp_path, "packed", step_tokens=16384, speed=1.5, ranges=RANGES,
               offsets=[0.4, 0.1, -0.1, 0.3])  # fmt: skip
    ref = _run(tmp_path, "baseline", step_tokens=8192, speed=1.0, ranges=RANGES,
               offsets=[0.4, 0.1, -0.1, -0.2])  # fmt: skip
    out, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    assert compare_runs([run, ref, "--json", str(out), "--out", str(png)]) == 0
    printed = capsys.readouterr().out.splitlines()
    c = json.loads(out.read_text())["comparisons"][0]
    b = c["by_length"]
    last = 80 * 8192
    assert b["at"] == c["equal_tokens"]["at"] == last and b["note"] is None
    assert b["ranges"] == RANGES
    assert [d["range"] for d in b["by_range"]] == ["1-60", "61-150", "151-300", "301-512"]
    gap = float(_loss(np.array(last), 1.5) - _loss(np.array(last), 1.0))  # < 0: run better
    want = [gap, gap, gap, gap + 0.5]
    for d, w in zip(b["by_range"], want, strict=True):
        assert d["diff"] == pytest.approx(w, abs=1e-9)
        assert d["diff"] == pytest.approx(d["run"] - d["reference"], abs=1e-12)
    assert [d["diff"] < 0 for d in b["by_range"]] == [True, True, True, False]
    line = next(x for x in printed if "held-out loss by document length" in x)
    assert "packed minus baseline" in line and "301-512 tok +" in line and "1-60 tok -" in line
    assert png.read_bytes().startswith(PNG)
    # Measured the other way round: every range's difference changes sign.
    assert compare_runs([ref, run, "--json", str(out)]) == 0
    back = json.loads(out.read_text())["comparisons"][0]["by_length"]["by_range"]
    for d, e in zip(back, b["by_range"], strict=True):
        assert d["diff"] == pytest.approx(-e["diff"], abs=1e-9)


def test_runs_split_by_other_lengths_are_not_compared_range_by_range_and_say_so(tmp_path, capsys):
    packed = _run(tmp_path, "packed", step_tokens=16384, speed=1.2, ranges=RANGES,
                  offsets=[0.3, 0.1, 0.0, -0.1])  # fmt: skip
    bucketed = _run(tmp_path, "bucketed", step_tokens=16384, speed=1.0,
                    edges=(0, 128, 256, 512), offsets=[0.2, 0.0, -0.2])  # fmt: skip
    other = _run(tmp_path, "other", step_tokens=16384, speed=1.0, ranges=[0, 50, 512],
                 offsets=[0.1, -0.1])  # fmt: skip
    old = _run(tmp_path, "old", step_tokens=16384, speed=1.0)  # recorded no length figures
    out = tmp_path / "cmp.json"
    png = tmp_path / "cmp.png"
    assert compare_runs([packed, bucketed, other, old, "--json", str(out), "--out", str(png)]) == 0
    printed = capsys.readouterr().out
    got = {c["reference"]: c["by_length"] for c in json.loads(out.read_text())["comparisons"]}
    for name in ("bucketed", "other", "old"):
        assert got[name]["ranges"] is None and got[name]["by_range"] == []
    assert got["bucketed"]["reference_ranges"] == [0, 128, 256, 512]
    assert (
        "different lengths" in got["bucketed"]["note"]
        and "1-128, 129-256, 257-512 tok (buckets)" in printed
    )
    assert "different lengths" in got["other"]["note"]
    assert got["old"]["note"] == "old recorded no held-out loss by length"
    assert png.read_bytes().startswith(PNG)
    # Two bucketed runs with the same edges: their buckets are compared as length ranges.
    twin = _run(tmp_path, "twin", step_tokens=16384, speed=1.2, edges=(0, 128, 256, 512),
                offsets=[0.2, 0.0, -0.1])  # fmt: skip
    assert compare_runs([twin, bucketed, "--json", str(out)]) == 0
    b = json.loads(out.read_text())["comparisons"][0]["by_length"]
    assert b["ranges"] == [0, 128, 256, 512]
    assert b["by_range"][2]["diff"] == pytest.approx(b["by_range"][0]["diff"] + 0.1, abs=1e-9)
    # Runs without any length figures: no entry, no line (as before).
    capsys.readouterr()
    assert compare_runs([old, old, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["comparisons"][0]["by_length"] is None
    assert "by document length" not in capsys.readouterr().out
