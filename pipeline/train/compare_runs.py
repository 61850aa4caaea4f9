"""Runs compared from their run directories alone (`jobs.compare_runs`): the first run measured
against each of the others at equal real tokens and at equal training time, a verdict line per
comparison, the held-out loss of each document length range at the last common token count
(where both runs split it by the same ranges), the jumpiness of each run taken apart, a JSON
record and a picture.

A run's held-out loss by length is what its evaluations recorded: by the length ranges of its
training loss where it trains one bucket (packed rows, or a baseline batching across all
lengths; `pipeline.core.length_ranges.run_ranges`), by its training buckets where it has
several. Two runs are compared range by range only where their edges are the same; otherwise
the comparison says so.

Held-out losses are compared only between runs evaluated on the same held-out set (the digest
each run records, `run_record.heldout_digest`) with the same model config; otherwise the
comparison is still made, with a warning saying so.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.compare import Curve, Standing, reached_at, standing
from pipeline.core.length_ranges import range_label
from pipeline.train.picture_jumpiness import history_jumpiness
from pipeline.train.run_record import RunRecord

__all__ = ["RunCurves", "by_length", "by_length_line", "compare", "verdict_line"]


class RunCurves:
    """A run's series on the comparison's axes: real tokens and seconds of training steps."""

    def __init__(self, run: RunRecord):
        self.run, self.name = run, run.name
        a = run.history.arrays()
        self.a = a
        self.tokens = np.cumsum(a["real"].astype(float))
        self.seconds = np.cumsum(np.nan_to_num(a["seconds"].astype(float)))
        ev = run.evals.arrays() if len(run.evals) else None
        steps = ev["step"].astype(int) if ev is not None else np.zeros(0, int)
        self.eval_loss = ev["loss"] if ev is not None else np.zeros(0)
        self.eval_tokens = self._at_steps(self.tokens, steps)
        self.eval_seconds = self._at_steps(self.seconds, steps)
        buckets = int(a["bucket"].max()) + 1 if a["bucket"].size else 1
        # The training loss to read: the bucket-debiased one where steps have buckets.
        self.train_label = "debiased training loss" if buckets > 1 else "training loss"
        self.train = a["debiased" if buckets > 1 else "loss"].astype(float)
        self.length_edges, self.length_source, self.eval_by_length = _by_length_of(run, ev)

    @staticmethod
    def _at_steps(cum: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """The cumulative value after each of `steps` global steps (0 before the first)."""
        idx = np.clip(steps - 1, 0, max(cum.size - 1, 0))
        vals = cum[idx] if cum.size else np.zeros(steps.size)
        return np.where(steps > 0, vals, 0.0)

    def held_out(self, axis: str) -> Curve:
        x = self.eval_tokens if axis == "tokens" else self.eval_seconds
        return Curve.of(x, self.eval_loss)

    def held_out_by_length(self, r: int) -> Curve:
        """The held-out loss of length range r (of `length_edges`) against real tokens."""
        return Curve.of(self.eval_tokens, self.eval_by_length[:, r])


def _by_length_of(run: RunRecord, ev: dict | None) -> tuple[list[int], str, np.ndarray]:
    """(edges, what they are, [evaluations, ranges] held-out loss) of a run's held-out loss by
    document length: by its length ranges where it recorded them (one bucket), by its buckets
    where it has several; ([], "", no column) where it recorded neither."""
    n = len(ev["loss"]) if ev is not None else 0
    if ev is not None and run.evals.range_edges and "loss_by_length" in ev:
        return list(run.evals.range_edges), "length ranges", ev["loss_by_length"]
    K = len(run.edges) - 1
    if ev is not None and K > 1 and ev["loss_by_bucket"].shape[1] == K:
        return list(run.edges), "buckets", ev["loss_by_bucket"]
    return [], "", np.zeros((n, 0))


def _warnings(run: RunRecord, ref: RunRecord) -> list[str]:
    out = []
    a, b = run.heldout.get("digest"), ref.heldout.get("digest")
    if a is None or b is None:
        missing = run.name if a is None else ref.name
        out.append(
            f"{missing} has no held-out record: cannot check that {run.name} and {ref.name} "
            "were evaluated on the same held-out set"
        )
    elif a != b:
        out.append(
            f"{run.name} and {ref.name} were evaluated on different held-out sets (digests {a} "
            f"and {b}): their held-out losses are not comparable as they stand"
        )
    ma, mb = run.config.get("model"), ref.config.get("model")
    if ma is not None and mb is not None and ma != mb:
        keys = sorted(k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k))
        out.append(
            f"{run.name} and {ref.name} train different models (model.{', model.'.join(keys)})"
        )
    return out


def _fmt_tokens(x: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.0f}"


def _gap(s: Standing) -> str:
    word = "better" if s.diff < 0 else "worse"
    return f"{abs(s.diff):.3f} {word}"


def _trend(s: Standing) -> str:
    if not np.isfinite(s.trend):
        return "too few evaluations for a trend"
    if abs(s.trend) < 0.002:
        return "steady over the last evaluations"
    gap = "lead" if s.diff < 0 else "deficit"
    way = "growing" if (s.trend < 0) == (s.diff < 0) else "shrinking"
    return f"its {gap} {way} by {abs(s.trend):.3f} over the last evaluations"


def _edges_text(run: RunCurves) -> str:
    e = run.length_edges
    return f"{', '.join(range_label(e, r) for r in range(len(e) - 1))} tok ({run.length_source})"


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def by_length(run: RunCurves, ref: RunCurves, at: float | None) -> dict | None:
    """Each length range's held-out loss of `run` and `ref` at `at` real tokens (their last
    common token count) and the difference (run - reference; < 0: the run is better there),
    where both split it by the same edges; otherwise a note saying why not. None where
    neither run recorded held-out loss by length."""
    a, b = run.length_edges, ref.length_edges
    if not a and not b:
        return None
    out: dict = {"at": at, "ranges": None, "run_ranges": a, "reference_ranges": b}
    out["by_range"], out["note"] = [], None
    if not a or not b:
        out["note"] = f"{run.name if not a else ref.name} recorded no held-out loss by length"
    elif a != b:
        out["note"] = (
            f"{run.name} and {ref.name} split the held-out loss by different lengths "
            f"({run.name}: {_edges_text(run)}; {ref.name}: {_edges_text(ref)}): not compared "
            "range by range"
        )
    elif at is None:
        out["note"] = "no common held-out evaluations"
    else:
        out["ranges"] = list(a)
        for r in range(len(a) - 1):
            x, y = run.held_out_by_length(r).at(at), ref.held_out_by_length(r).at(at)
            d = {"range": range_label(a, r), "run": _finite(x), "reference": _finite(y)}
            d["diff"] = _finite(x - y)
            out["by_range"].append(d)
    return out


def by_length_line(c: dict) -> str | None:
    """One line: each length range's held-out difference, or why there is none; None where
    neither run recorded held-out loss by length."""
    b = c.get("by_length")
    if b is None:
        return None
    if b["note"] is not None:
        return f"  held-out loss by document length: {b['note']}"
    diffs = [
        f"{d['range']} tok {d['diff']:+.3f}" if d["diff"] is not None else f"{d['range']} tok -"
        for d in b["by_range"]
    ]
    return (
        f"  held-out loss by document length at {_fmt_tokens(b['at'])} tokens, {c['run']} "
        f"minus {c['reference']}: {', '.join(diffs)}"
    )


def compare(run: RunCurves, ref: RunCurves) -> dict:
    """`run` against `ref`: its standing at equal tokens and at equal time, each length range's
    held-out difference at the last common token count (`by_length`), and when it reached the
    reference's final held-out loss (in tokens and seconds, and as a ratio of the reference's
    own)."""
    tok = standing(run.held_out("tokens"), ref.held_out("tokens"))
    sec = standing(run.held_out("seconds"), ref.held_out("seconds"))
    out: dict = {
        "run": run.name,
        "reference": ref.name,
        "equal_tokens": tok.to_dict() if tok else None,
        "equal_time": sec.to_dict() if sec else None,
        "warnings": _warnings(run.run, ref.run),
        "by_length": by_length(run, ref, tok.at if tok else None),
    }
    if ref.eval_loss.size:
        target = float(ref.eval_loss[-1])
        at_tok = reached_at(run.held_out("tokens"), target)
        at_sec = reached_at(run.held_out("seconds"), target)
        ref_tok, ref_sec = float(ref.eval_tokens[-1]), float(ref.eval_seconds[-1])
        out["reach"] = {
            "target": target,
            "tokens": at_tok,
            "seconds": at_sec,
            "tokens_ratio": at_tok / ref_tok if ref_tok > 0 else float("nan"),
            "seconds_ratio": at_sec / ref_sec if ref_sec > 0 else float("nan"),
        }
    return out


def verdict_line(c: dict) -> str:
    """One line: where the run stands against the reference."""
    parts = [f"{c['run']} against {c['reference']}:"]
    tok, sec = c["equal_tokens"], c["equal_time"]
    if tok is None:
        return parts[0] + " no common held-out evaluations to compare"
    t = Standing(**tok)
    parts.append(
        f"held-out {t.run:.3f} vs {t.reference:.3f} at {_fmt_tokens(t.at)} tokens, "
        f"{_gap(t)} ({_trend(t)});"
    )
    if sec is not None:
        s = Standing(**sec)
        parts.append(f"at equal time ({s.at:.0f} s of steps) {_gap(s)};")
    r = c.get("reach")
    if r is not None:
        if np.isfinite(r["tokens"]):
            when = "sooner" if r["tokens_ratio"] < 1 else "later"
            parts.append(
                f"reached {c['reference']}'s final {r['target']:.3f} at "
                f"{_fmt_tokens(r['tokens'])} tokens ({r['tokens_ratio']:.2f}x its tokens, {when})"
            )
        else:
            parts.append(f"has not reached {c['reference']}'s final {r['target']:.3f}")
    return " ".join(parts)


def jumpiness_of(run: RunCurves) -> dict:
    return history_jumpiness(run.a).to_dict()
