"""The picture's length panel for a run whose steps mix every length (packed rows, or one
bucket): the training loss of each document length range, a point at every step, its held-out
loss at each evaluation (dots, by the same ranges), and the text panel's lines about it. A
bucketed run draws each bucket's loss instead (`run_picture`)."""

from __future__ import annotations

import numpy as np

from pipeline.core.length_ranges import range_label

__all__ = [
    "draw_range_evals",
    "draw_range_losses",
    "has_ranges",
    "range_lines",
    "range_step_losses",
]


def has_ranges(a: dict) -> bool:
    """Whether a history's arrays hold the loss by length range (`StepHistory.arrays`)."""
    return "range_loss" in a and a["range_loss"].size > 0


def range_step_losses(a: dict) -> np.ndarray:
    """[steps, ranges]: each step's token-mean loss of each range (NaN: no token of it)."""
    loss, tokens = a["range_loss"], a["range_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tokens > 0, loss / np.where(tokens > 0, tokens, 1.0), np.nan)


def _smoothed(y: np.ndarray, weight: float = 0.8) -> np.ndarray:
    """Exponential mean over the finite points (`weight` on the past), carried over a step
    without a token of the range (packing can leave a range out of a step)."""
    out, acc = np.full_like(y, np.nan), np.nan
    for i, v in enumerate(y):
        if np.isfinite(v):
            acc = v if not np.isfinite(acc) else weight * acc + (1 - weight) * v
        out[i] = acc
    return out


def draw_range_losses(ax, a: dict, edges: list[int], cmap) -> None:
    """One curve per length range: each step's loss of that range's documents (thin), and its
    exponential mean (thick), in the ranges' length order."""
    step, per = a["step"], range_step_losses(a)
    for r in range(per.shape[1]):
        colour = cmap(r / max(per.shape[1] - 1, 1))
        ax.plot(step, per[:, r], color=colour, lw=0.5, alpha=0.45)
        ax.plot(step, _smoothed(per[:, r]), color=colour, lw=1.5, label=range_label(edges, r))
    finite = per[np.isfinite(per)]
    if finite.size:
        late = per[len(per) // 10 :]  # the untrained first steps would squash the curves
        lo, hi = np.nanmin(late), np.nanpercentile(late, 99.5)
        pad = 0.05 * max(hi - lo, 1e-3)
        ax.set_ylim(lo - pad, hi + pad)
    ax.set_title("training loss by document length (tokens), every step")
    ax.set_xlabel("global step")
    ax.set_ylabel("loss (nats per supervised token)")
    ax.legend(loc="upper right", fontsize=8, title="document length", title_fontsize=8)


def draw_range_evals(ax, ev: dict, edges: list[int], cmap) -> None:
    """Each length range's held-out loss at each evaluation, as dots in its curve's colour
    (`EvalHistory.arrays()["loss_by_length"]`, by the same `edges`); the y axis widened to
    hold them (the untrained evaluation at step 0 left out), the legend in one row in the room
    added above the curves, at the right, where falling curves are lowest."""
    from matplotlib.lines import Line2D

    held = ev["loss_by_length"]
    R = held.shape[1]
    for r in range(R):
        ax.plot(ev["step"], held[:, r], lw=0, marker="o", ms=5, mfc=cmap(r / max(R - 1, 1)),
                mec="#000000", mew=0.7, zorder=5)  # fmt: skip
    late = held[ev["step"] > 0]
    late = late[np.isfinite(late)]
    lo, hi = ax.get_ylim()
    if late.size:
        pad = 0.05 * max(hi - lo, 1e-3)
        lo, hi = min(lo, float(late.min()) - pad), max(hi, float(late.max()) + pad)
    ax.set_ylim(lo, hi + 0.2 * (hi - lo))  # room for the legend's row
    ax.set_title("loss by document length (tokens): each step; held-out: dots")
    dot = Line2D([], [], lw=0, marker="o", ms=5, mfc="#bbbbbb", mec="#000000", label="held-out")
    handles = [*ax.get_legend_handles_labels()[0], dot]
    ax.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=7.5,
              title="document length", title_fontsize=7.5, columnspacing=1.0,
              handlelength=1.5)  # fmt: skip


def range_lines(a: dict, edges: list[int], last: int = 10, held: np.ndarray | None = None):
    """The text panel's lines: each range's loss over the last `last` steps and its share of
    the run's supervised tokens; with `held` (each range's last held-out loss), that too."""
    loss, tokens = a["range_loss"][-last:], a["range_tokens"][-last:]
    share = np.nansum(a["range_tokens"], axis=0) / max(np.nansum(a["range_tokens"]), 1.0)
    lines = ["every step mixes every length; loss by", f"document length, last {last} steps:"]
    if held is not None and held.size:
        lines[-1] = f"document length, last {last} steps"
        lines.append("(after |: held-out, last evaluation):")
    for r in range(loss.shape[1]):
        t = np.nansum(tokens[:, r])
        value = f"{np.nansum(loss[:, r]) / t:.3f}" if t > 0 else "  -  "
        line = f"  {range_label(edges, r):>9} tok {value} ({100 * share[r]:.0f}% of tok)"
        if held is not None and held.size:
            line += f" | {held[r]:.3f}" if np.isfinite(held[r]) else " |   -"
        lines.append(line)
    return lines
