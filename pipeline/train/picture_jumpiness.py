"""A run's jumpiness taken apart (`pipeline.core.jumpiness`), read from its step history: for the
picture (a bar of the three shares under the text panel), the end of a run and `compare_runs`."""

from __future__ import annotations

import numpy as np

from pipeline.core.jumpiness import Jumpiness, decompose_steps

__all__ = ["draw_jumpiness", "history_jumpiness", "print_run_jumpiness", "run_jumpiness"]

_PARTS = (("composition", "#4477aa"), ("schedule", "#ccbb44"), ("rest", "#bbbbbb"))


def history_jumpiness(a: dict) -> Jumpiness:
    """The decomposition of a step history's arrays (`StepHistory.arrays`): by length range
    where the run recorded ranges, else by bucket."""
    return decompose_steps(
        a["loss"].astype(float),
        a["bucket"].astype(int),
        a.get("range_loss"),
        a.get("range_tokens"),
    )


def draw_jumpiness(fig, ax_text, j: Jumpiness) -> None:
    """One horizontal bar in the strip under the text panel: the shares of the step-to-step
    variance, its title the reading in words."""
    box = ax_text.get_position()
    ax = fig.add_axes([box.x0, 0.035, box.x1 - box.x0, 0.035])
    ax.set_title("\n".join(j.lines()[:1] + [" ".join(" ".join(j.lines()[1:]).split())]),
                 fontsize=8, loc="left")  # fmt: skip
    if not np.isfinite(j.variance):
        ax.axis("off")
        return
    left = 0.0
    for name, colour in _PARTS:
        share = max(float(getattr(j, name)), 0.0)
        ax.barh(0, share, left=left, color=colour, edgecolor="white")
        if share >= 0.08:
            ax.text(left + share / 2, 0, f"{name}\n{100 * share:.0f}%", ha="center",
                    va="center", fontsize=7)  # fmt: skip
        left += share
    ax.set_xlim(0, max(left, 1.0))
    ax.set_yticks([])
    ax.set_xticks([0, 0.5, 1.0])
    ax.tick_params(labelsize=7)


def run_jumpiness(run_dir: str) -> Jumpiness | None:
    """The decomposition of the run at `run_dir` (local or URI) from its latest checkpoint's
    step history; None where it has none."""
    from pipeline.data.fs import filesystem_for
    from pipeline.train.history import read_history
    from pipeline.train.resume_check import latest_position

    fs, rdir = filesystem_for(run_dir)
    found = latest_position(fs, rdir.rstrip("/"))
    if found is None:
        return None
    history = read_history(fs, found[0])
    return history_jumpiness(history.arrays()) if len(history) else None


def print_run_jumpiness(run_dir: str) -> None:
    """The end of a run: why its training loss was jumpy, in one console line."""
    j = run_jumpiness(run_dir)
    if j is not None:
        print("[bucketray] " + " ".join(" ".join(j.lines()).split()), flush=True)
