"""The picture of a comparison (`jobs.compare_runs --out`): held-out loss against real tokens
and against training time, the held-out loss of each document length range against real tokens
beside them with each range's difference at the last common token count, the training loss
(bucket-debiased where steps have buckets) and the learning rate against real tokens, one colour
per run (the first run, measured, in black; in the length panel one colour per range, one line
style per run), the verdict lines and each run's jumpiness taken apart."""

from __future__ import annotations

import os
import textwrap

import numpy as np

from pipeline.core.length_ranges import range_label
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

    fig, axes = plt.subplots(2, 4, figsize=(22, 9.5))
    (ax_tok, ax_len, ax_sec, ax_text), (ax_train, ax_lr, ax_jump, ax_diff) = axes
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
    _draw_by_length(ax_len, runs, plt.get_cmap("viridis"))
    _draw_length_diffs(ax_diff, runs, comparisons, plt.get_cmap("viridis"))
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
        b = c.get("by_length")
        if b is not None and b["note"] is not None:
            lines += textwrap.wrap(f"held-out loss by length: {b['note']}", 52) + [""]
        for w in c["warnings"]:
            lines += textwrap.wrap("warning: " + w, 52) + [""]
    ax.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=8.5)


def _draw_jumpiness(ax, runs: list[RunCurves]) -> None:
    """Per run, a bar of its step-to-step variance's shares."""
    from pipeline.train.picture_jumpiness import PARTS, history_jumpiness, share_of

    widest = 1.0
    for i, r in enumerate(runs):
        j = history_jumpiness(r.a)
        left = 0.0
        for name, colour in PARTS:
            share = share_of(j, name)
            ax.barh(i, share, left=left, color=colour, edgecolor="white",
                    label=name if i == 0 else None)  # fmt: skip
            if share >= 0.08:
                ax.text(left + share / 2, i, f"{100 * share:.0f}%", ha="center", va="center",
                        fontsize=8)  # fmt: skip
            left += share
        widest = max(widest, left)  # the parts are estimates: they may add up to a bit more
    ax.set_yticks(range(len(runs)))
    ax.set_yticklabels([r.name for r in runs])
    ax.invert_yaxis()
    ax.set_xlim(0, widest)
    ax.set_title("step-to-step training-loss variance, taken apart")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.06), ncol=len(PARTS))


_STYLES = ("-", "--", ":", "-.")


def _range_colour(cmap, r: int, n: int):
    return cmap(0.85 * r / max(n - 1, 1))  # viridis without its palest yellow


def _draw_by_length(ax, runs: list[RunCurves], cmap) -> None:
    """The held-out loss of each length range against real tokens: one colour per range, one
    line style per run; the runs that split it by the first run's ranges."""
    edges = runs[0].length_edges
    if not edges:
        _empty(ax, f"{runs[0].name} recorded no held-out loss by length")
        return
    same = [r for r in runs if r.length_edges == edges]
    n = len(edges) - 1
    for i, r in enumerate(same):
        for k in range(n):
            ax.plot(r.eval_tokens / 1e6, r.eval_by_length[:, k], color=_range_colour(cmap, k, n),
                    ls=_STYLES[i % len(_STYLES)], lw=1.6 if i == 0 else 1.2, marker="o",
                    ms=2.5)  # fmt: skip
    _clip(ax, [r.eval_by_length[:, k] for r in same for k in range(n)])
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=_range_colour(cmap, k, n), lw=2, label=f"{range_label(edges, k)} tok")
        for k in range(n)
    ] + [Line2D([], [], color="#444444", ls=_STYLES[i % len(_STYLES)], label=r.name)
         for i, r in enumerate(same)]  # fmt: skip
    ax.legend(handles=handles, fontsize=7.5, loc="upper right", ncol=2)
    other = [r.name for r in runs if r.length_edges != edges]
    source = " (each bucket's)" if runs[0].length_source == "buckets" else ""
    ax.set_title(f"held-out loss by document length{source}")
    if other:
        ax.text(0.01, 0.01, f"not drawn (other lengths): {', '.join(other)}", fontsize=7.5,
                transform=ax.transAxes, va="bottom")  # fmt: skip
    ax.set_xlabel("real tokens trained (M)")


def _draw_length_diffs(ax, runs: list[RunCurves], comparisons: list[dict], cmap) -> None:
    """Per comparison with the same ranges, each range's held-out difference (run minus
    reference) at the last common token count, as bars; a note for the others."""
    done = [c for c in comparisons if c.get("by_length") and c["by_length"]["ranges"]]
    notes = [f"{c['run']} against {c['reference']}: {c['by_length']['note']}"
             for c in comparisons if c.get("by_length") and c["by_length"]["note"]]  # fmt: skip
    if not done:
        _empty(ax, "\n\n".join(notes) or "no held-out loss by length recorded")
        ax.set_title("held-out loss by length: run minus reference")
        return
    n = len(done[0]["by_length"]["ranges"]) - 1
    width = 0.8 / len(done)
    hatches = ("", "//", "..", "xx")
    for j, c in enumerate(done):
        for k, d in enumerate(c["by_length"]["by_range"]):
            x, v = k + (j - (len(done) - 1) / 2) * width, d["diff"]
            if v is None:
                continue
            ax.bar(x, v, width * 0.9, color=_range_colour(cmap, k, n), edgecolor="#222222",
                   hatch=hatches[j % 4], lw=0.6)  # fmt: skip
            ax.annotate(f"{v:+.3f}", (x, v), xytext=(0, 3 if v >= 0 else -3),
                        textcoords="offset points", ha="center",
                        va="bottom" if v >= 0 else "top", fontsize=8)  # fmt: skip
    ax.axhline(0.0, color="#222222", lw=0.8)
    _room_for_labels(ax, [d["diff"] for c in done for d in c["by_length"]["by_range"]])
    ax.set_xticks(range(n))
    ax.set_xticklabels([d["range"] for d in done[0]["by_length"]["by_range"]], fontsize=8)
    skipped = [c["reference"] for c in comparisons if c.get("by_length") and c["by_length"]["note"]]
    at = ", ".join(f"{c['by_length']['at'] / 1e6:.3g}M" for c in done)
    also = f"\nnot compared (other lengths or none): {', '.join(skipped)}" if skipped else ""
    ax.set_xlabel(f"document length (tokens), at the last common real tokens ({at})" + also)
    ax.set_ylabel(f"{done[0]['run']} minus reference (< 0: better)")
    if len(done) > 1:
        from matplotlib.patches import Patch

        handles = [Patch(facecolor="white", edgecolor="#222222", hatch=hatches[j % 4],
                         label=f"minus {c['reference']}") for j, c in enumerate(done)]  # fmt: skip
        ax.legend(handles=handles, fontsize=8, loc="best")
    ax.set_title(f"held-out loss by length, {done[0]['run']} minus {done[0]['reference']}"
                 if len(done) == 1 else f"held-out loss by length, {done[0]['run']} minus each",
                 fontsize=10.5)  # fmt: skip


def _room_for_labels(ax, values: list) -> None:
    """The y axis from the lowest bar to the highest, 0 included, with room past each end for
    the bars' value labels (a bar near 0 would otherwise put its label on the axis' edge)."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    lo, hi = min(0.0, float(v.min(initial=0.0))), max(0.0, float(v.max(initial=0.0)))
    pad = 0.18 * max(hi - lo, 1e-3)
    ax.set_ylim(lo - pad, hi + pad)


def _empty(ax, text: str) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, "\n".join(textwrap.fill(t, 48) for t in text.split("\n")), ha="center",
            va="center", fontsize=9, transform=ax.transAxes, color="#444444")  # fmt: skip
