"""A run's jumpiness taken apart (`pipeline.core.jumpiness`), read from its step history: for the
picture (a bar of the three shares under the text panel), the end of a run and `compare_runs`."""

from __future__ import annotations

import textwrap

import numpy as np

from pipeline.core.jumpiness import Jumpiness, decompose_steps, share_percent

__all__ = [
    "PARTS",
    "draw_jumpiness",
    "share_of",
    "history_jumpiness",
    "print_run_jumpiness",
    "run_jumpiness",
]

PARTS = (
    ("composition", "#4477aa"),
    ("schedule", "#ccbb44"),
    ("noise", "#99ddff"),
    ("rest", "#bbbbbb"),
)


def history_jumpiness(a: dict) -> Jumpiness:
    """The decomposition of a step history's arrays (`StepHistory.arrays`): by length range
    where the run recorded ranges, else by bucket."""
    return decompose_steps(
        a["loss"].astype(float),
        a["bucket"].astype(int),
        a.get("range_loss"),
        a.get("range_tokens"),
        a.get("noise"),
    )


def share_of(j: Jumpiness, part: str) -> float:
    """A part's share as drawn: 0 where it is negative or unknown."""
    share = float(j.noise_shown if part == "noise" else getattr(j, part))
    return max(share, 0.0) if np.isfinite(share) and np.isfinite(j.variance) else 0.0


def draw_jumpiness(fig, ax_text, j: Jumpiness) -> None:
    """One horizontal bar in the strip under the text panel: the shares of the step-to-step
    variance (each with its band's half-width), its title the reading in words."""
    box = ax_text.get_position()
    ax = fig.add_axes([box.x0, 0.035, box.x1 - box.x0, 0.035])
    rest = textwrap.wrap(" ".join(" ".join(j.lines()[1:]).split()), 64)
    ax.set_title("\n".join(j.lines()[:1] + rest), fontsize=8, loc="left")
    if not np.isfinite(j.variance):
        ax.axis("off")
        return
    left = 0.0
    for name, colour in PARTS:
        share = share_of(j, name)
        ax.barh(0, share, left=left, color=colour, edgecolor="white")
        if share >= 0.08:
            label = f"{name}\n{share_percent(share, j.band_shown(name))}"
            ax.text(left + share / 2, 0, label, ha="center",
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
