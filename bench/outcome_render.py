"""The outcome's tables and plot in BENCHMARKS.md, from `bench.outcome`'s JSON.

Tables only: the prose around them in BENCHMARKS.md is written by hand. The block between the
`outcome:start` and `outcome:end` markers is replaced; everything else in the file is kept.

    python -m bench.outcome_render --json benchmarks/outcome.json --md BENCHMARKS.md \\
        --png benchmarks/outcome.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.outcome import LABELS

__all__ = ["outcome_tables", "plot_outcome", "replace_block"]

START, END = "<!-- outcome:start -->", "<!-- outcome:end -->"


def _seeds(values) -> str:
    return ", ".join(f"{v:.4f}" for v in values)


def outcome_tables(results: dict) -> str:
    """The equal-optimisation and equal-time tables, policies as measured."""
    s = results["summary"]
    out = [
        f"`{results['command'].strip()}`, {results['date_utc']}, {results['machine']}: "
        f"{results['corpus']['train_samples']:,} training and "
        f"{results['corpus']['heldout_samples']:,} held-out definitions "
        f"({results['heldout_tokens']:,} held-out tokens), {results['epochs']} epochs, "
        f"held-out loss every {results['eval_every']} steps, seeds {', '.join(_seed_names(s))}.",
        "",
    ]
    if "optimisation" in s:
        out += [
            f"**At equal optimisation** (`batching.mode=fixed`, {results['batch_size']} samples "
            "per step; packed rows: 8 rows of 2,048 tokens):",
            "",
            "| policy | held-out loss (mean) | spread over seeds | each seed | loss per sample "
            "(mean) | steps |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in _by_mean(s["optimisation"]):
            out.append(
                f"| {LABELS.get(name, name)} | {row['mean']:.4f} | {row['spread']:.4f} | "
                f"{_seeds(row['loss'])} | {row['loss_per_sample_mean']:.4f} | "
                f"{int(np.mean(row['steps']))} |"
            )
        out.append("")
    if "time" in s and "throughput" in results:
        tp = results["throughput"]
        out += [
            f"**At equal time** (each policy as it runs; a budget of "
            f"{results['time_budget_s']:.0f} s, sorted-static's {results['epochs']} epochs at "
            "its measured rate):",
            "",
            "| policy | real tok/s vs sorted-static (same run, rounds) | steps in the budget | "
            "real tokens | held-out loss (mean) | spread | each seed | time to sorted-static's "
            "loss |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, row in _by_mean(s["time"]):
            ratios = np.asarray(tp[name]["ratio_to_reference"])
            reach = row.get("time_to_sorted_loss_s") or []
            got = [r for r in reach if r is not None]
            when = (
                f"{np.median(got):.0f} s ({len(got)}/{len(reach)} seeds)" if got else "not reached"
            )
            out.append(
                f"| {LABELS.get(name, name)} | {1 / np.median(ratios):.2f} "
                f"({', '.join(f'{1 / r:.2f}' for r in ratios)}) | {int(np.mean(row['steps']))} | "
                f"{row['real_tokens'] / 1e6:.2f}M | {row['mean']:.4f} | {row['spread']:.4f} | "
                f"{_seeds(row['loss'])} | {when} |"
            )
        out.append("")
    return "\n".join(out)


def _seed_names(summary: dict) -> list[str]:
    seeds = {s for q in summary.values() for row in q.values() for s in row["seeds"]}
    return sorted(seeds, key=int)


def _by_mean(table: dict):
    return sorted(table.items(), key=lambda kv: kv[1]["mean"])


def _curves(runs: dict, x: str, rate: float = 1.0):
    """(x grid, mean loss, min, max) over seeds, each seed interpolated on a common grid."""
    xs, ys = [], []
    for r in runs.values():
        ev = r["eval"]
        xv = np.asarray(ev["step"] if x == "step" else ev["real_tokens"], float) * rate
        xs.append(xv)
        ys.append(np.asarray(ev["loss"], float))
    top = min(v[-1] for v in xs)
    grid = np.linspace(0, top, 200)
    stack = np.array([np.interp(grid, xv, yv) for xv, yv in zip(xs, ys, strict=True)])
    return grid, stack.mean(0), stack.min(0), stack.max(0)


def plot_outcome(results: dict, path: str | Path) -> str:
    """Held-out loss at equal optimisation (against steps) and at equal time (against seconds
    and against real tokens): each policy's mean over seeds, the band their min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    panels = [("optimisation", "step", "global step (equal optimisation)")]
    if "time" in runs and "throughput" in results:
        panels += [
            ("time", "time", "seconds at the measured rate (equal time)"),
            ("time", "tokens", "real tokens (equal time)"),
        ]
    panels = [p for p in panels if p[0] in runs]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.6), squeeze=False)
    names = list(LABELS)
    cmap = plt.get_cmap("tab10")
    for ax, (q, x, label) in zip(axes[0], panels, strict=True):
        lows = []
        for name, by_seed in runs[q].items():
            rate = results["throughput"][name]["s_per_real_token"] if x == "time" else 1.0
            grid, mean, lo, hi = _curves(by_seed, "step" if x == "step" else "tokens", rate)
            color = cmap(names.index(name) % 10 if name in names else 9)
            ax.plot(grid, mean, color=color, lw=1.4, label=LABELS.get(name, name))
            ax.fill_between(grid, lo, hi, color=color, alpha=0.15, lw=0)
            lows.append(float(mean[len(mean) // 3]))
        ax.set_xlabel(label)
        ax.set_ylabel("held-out loss (nats per token)")
        bottom = min(min(r["eval"]["loss"]) for b in runs[q].values() for r in b.values())
        ax.set_ylim(bottom - 0.02, max(lows) + 0.05)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.suptitle("Held-out loss by batching policy (mean over seeds; band: min to max)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def replace_block(markdown: str, block: str) -> str:
    """`markdown` with the text between the outcome markers replaced by `block`."""
    if START not in markdown or END not in markdown:
        raise ValueError(f"no {START} ... {END} block to replace")
    head, rest = markdown.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{block.strip()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="benchmarks/outcome.json")
    ap.add_argument("--md", default="BENCHMARKS.md")
    ap.add_argument("--png", default="benchmarks/outcome.png")
    args = ap.parse_args(argv)
    results = json.loads(Path(args.json).read_text())
    plot_outcome(results, args.png)
    md = Path(args.md)
    md.write_text(replace_block(md.read_text(), outcome_tables(results)))
    print(f"outcome: tables in {md}, plot {args.png}")


if __name__ == "__main__":
    main()
