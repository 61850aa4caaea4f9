"""The bucket report (`build.build_report`) and the K frontier
(`pipeline.core.frontier.frontier`) as PNGs; matplotlib is imported lazily, inside the functions,
so importing this module costs nothing."""

from __future__ import annotations

import numpy as np

from pipeline.core.frontier import FrontierPoint

__all__ = ["plot_report", "plot_frontier"]


def plot_report(report: dict, lengths: np.ndarray, path) -> None:
    """PNG: length histogram with the chosen edges, each bucket shaded by its padding share, over
    a panel of each bucket's padding share (every sample padded to its upper edge)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on clusters or in CI
    import matplotlib.pyplot as plt

    lengths = np.asarray(lengths)
    edges = np.asarray(report["chosen"]["edges"])
    rows = report["buckets"]
    top = int(max(edges[-1], lengths.max()))
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, height_ratios=[3, 2])
    bins = np.arange(0, top + 32, 32)
    ax.hist(lengths, bins=bins, color="#4477aa", linewidth=0, zorder=2)
    share = np.array([1 - r["upper_efficiency"] for r in rows])
    for r, sh in zip(rows, share, strict=True):
        # Redder = more of the bucket's slots are padding; scaled to the worst bucket so it shows.
        alpha = 0.5 * sh / share.max() if share.max() > 0 else 0.0
        ax.axvspan(r["lower"], r["upper"], color="#cc3311", alpha=alpha, linewidth=0, zorder=0)
    for e in edges[1:]:
        ax.axvline(e, color="#222222", linewidth=0.6, zorder=3)
    ax.set_ylabel("samples per 32-token bin")
    eff = {p["name"]: p["efficiency"] for p in report["policies"]}
    name = report["chosen"]["name"]
    ax.set_title(
        f"{report['lengths']['samples']:,} samples, {name} (K={len(edges) - 1}): batch-max efficiency "
        f"{eff.get(name, float('nan')):.3f}, sorted {eff['sorted']:.3f}, random {eff['random']:.3f}\n"
        "lines: bucket upper edges; red shading: padding share when padded to the upper edge",
        fontsize=10,
    )
    lo = np.array([r["lower"] for r in rows])
    width = np.array([r["upper"] - r["lower"] for r in rows])
    ax2.bar(
        lo,
        100 * share,
        width=width,
        align="edge",
        color="#cc3311",
        edgecolor="white",
        linewidth=0.5,
    )
    u = report["to_upper_edge"]
    ax2.text(
        0.99,
        0.95,
        f"all buckets: {u['padding_tokens'] / 1e6:,.1f}M padding tokens for "
        f"{u['real_tokens'] / 1e6:,.1f}M real ({100 * (1 - u['efficiency']):.1f}%)",
        transform=ax2.transAxes,
        ha="right",
        va="top",
    )
    ax2.set_ylim(0, 100 * share.max() * 1.25 + 1e-9)  # headroom for the note
    ax2.set_ylabel("padding share per bucket (%)")
    ax2.set_xlabel("sample length (tokens)")
    ax2.set_xlim(0, top * 1.01)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_frontier(
    points: list[FrontierPoint], path, *, chosen: int | None = None, title=""
) -> None:
    """PNG: padding efficiency and recomposition floor against K (left), steps per epoch (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = [p.k for p in points]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax.plot(k, [p.efficiency for p in points], "o-", color="#4477aa", label="padding efficiency")
    ax.plot(k, [p.floor for p in points], "s-", color="#cc3311", label="recomposition floor")
    ax.set_xlabel("buckets K")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax2.plot(k, [p.steps for p in points], "o-", color="#228833")
    ax2.set_xlabel("buckets K")
    ax2.set_ylabel("global steps per epoch")
    ax2.grid(alpha=0.3)
    if chosen is not None:
        for a in (ax, ax2):
            a.axvline(chosen, color="#222222", linewidth=0.8, linestyle="--")
    ax.legend(loc="center right")
    fig.suptitle(title or "K trade-off: padding vs recomposition vs steps", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
