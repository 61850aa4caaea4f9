"""The picture of a comparison (`jobs.compare_runs --out`): held-out loss against real tokens
and against training time, the training loss (bucket-debiased where steps have buckets) and the
learning rate against real tokens, one colour per run (the first run, measured, in black), the
verdict lines and each run's jumpiness taken apart."""

from __future__ import annotations

import os
import textwrap

import numpy as np

from pipeline.train.compare_runs import RunCurves

__all__ = ["draw_comparison"]

_COLOURS = ("#000000", "#ee7733", "#0077bb", "#009988", "#cc3311", "#aa3377")


def _smooth(y: np.ndarray, half: int = 5) -> np.ndarray:
    """Centred mean over 2 * half + 1 steps (fewer at the ends): no lag behind a falling
    curve, as an exponential mean would have."""
    y = np.asarray(y, float)
    ok = np.isfinite(y)
    cs = np.concatenate([[0.0], np.cumsum(np.where(ok, y, 0.0))])
    cn = np.concatenate([[0], np.cumsum(ok)])
    i = np.arange(y.size)
    lo, hi = np.clip(i - half, 0, y.size), np.clip(i + half + 1, 0, y.size)
    n = cn[hi] - cn[lo]
    return np.where(n > 0, (cs[hi] - cs[lo]) / np.maximum(n, 1), np.nan)


def draw_comparison(runs: list[RunCurves], comparisons: list[dict], path: str) -> str:
    """Write the comparison's PNG to `path`; returns `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    (ax_tok, ax_sec, ax_text), (ax_train, ax_lr, ax_jump) = axes
    for i, r in enumerate(runs):
        c = _COLOURS[i % len(_COLOURS)]
        lw = 2.0 if i == 0 else 1.4
        ax_tok.plot(r.eval_tokens / 1e6, r.eval_loss, color=c, lw=lw, marker="o", ms=3,
                    label=r.name)  # fmt: skip
        ax_sec.plot(r.eval_seconds, r.eval_loss, color=c, lw=lw, marker="o", ms=3, label=r.name)
        ax_train.plot(r.tokens / 1e6, r.train, color=c, lw=0.4, alpha=0.3)
        ax_train.plot(r.tokens / 1e6, _smooth(r.train), color=c, lw=lw,
                      label=f"{r.name} ({r.train_label})")  # fmt: skip
        ax_lr.plot(r.tokens / 1e6, r.a["lr"].astype(float), color=c, lw=lw, label=r.name)
    _clip(ax_tok, [r.eval_loss for r in runs])
    _clip(ax_sec, [r.eval_loss for r in runs])
    _clip(ax_train, [r.train[len(r.train) // 10 :] for r in runs])
    for ax, title, xlabel in (
        (ax_tok, "held-out loss at equal real tokens", "real tokens trained (M)"),
        (ax_sec, "held-out loss at equal training time", "seconds of training steps"),
        (ax_train, "training loss (mean of 11 steps; each step faint)", "real tokens trained (M)"),
        (ax_lr, "learning rate", "real tokens trained (M)"),
    ):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.legend(fontsize=8, loc="upper right")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    _draw_verdicts(ax_text, comparisons)
    _draw_jumpiness(ax_jump, runs)
    fig.suptitle(f"{runs[0].name} measured against {', '.join(r.name for r in runs[1:])}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _clip(ax, series: list[np.ndarray]) -> None:
    """The y axis on the curves' trained range (an untrained first point would squash it)."""
    vals = np.concatenate([np.asarray(s, float)[1:] for s in series if np.size(s) > 1] or [[]])
    vals = vals[np.isfinite(vals)]
    if vals.size:
        lo, hi = float(vals.min()), float(np.percentile(vals, 99))
        pad = 0.05 * max(hi - lo, 1e-3)
        ax.set_ylim(lo - pad, hi + pad)


def _draw_verdicts(ax, comparisons: list[dict]) -> None:
    from pipeline.train.compare_runs import verdict_line

    ax.axis("off")
    lines = []
    for c in comparisons:
        lines += textwrap.wrap(verdict_line(c), 52) + [""]
        for w in c["warnings"]:
            lines += textwrap.wrap("warning: " + w, 52) + [""]
    ax.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=8.5)


def _draw_jumpiness(ax, runs: list[RunCurves]) -> None:
    """Per run, a bar of its step-to-step variance's shares."""
    from pipeline.train.picture_jumpiness import history_jumpiness

    parts = (("composition", "#4477aa"), ("schedule", "#ccbb44"), ("rest", "#bbbbbb"))
    for i, r in enumerate(runs):
        j = history_jumpiness(r.a)
        left = 0.0
        for name, colour in parts:
            share = max(float(getattr(j, name)), 0.0) if np.isfinite(j.variance) else 0.0
            ax.barh(i, share, left=left, color=colour, edgecolor="white",
                    label=name if i == 0 else None)  # fmt: skip
            if share >= 0.08:
                ax.text(left + share / 2, i, f"{100 * share:.0f}%", ha="center", va="center",
                        fontsize=8)  # fmt: skip
            left += share
    ax.set_yticks(range(len(runs)))
    ax.set_yticklabels([r.name for r in runs])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_title("step-to-step training-loss variance, taken apart")
    ax.legend(fontsize=8, loc="lower right")
