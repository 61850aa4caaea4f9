"""The outcome's tables and plot in BENCHMARKS.md, from `bench.outcome`'s JSON.

Tables only: the prose around them in BENCHMARKS.md is written by hand. The block between the
`outcome:start` and `outcome:end` markers is replaced, and in the README the one between
`outcome:headline:start` and `outcome:headline:end`; everything else in the files is kept.

    python -m bench.outcome_render --json benchmarks/outcome.json --md BENCHMARKS.md \\
        --png benchmarks/outcome.png --readme README.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench import tables
from bench.outcome import LABELS, summarize

__all__ = ["outcome_headline", "outcome_tables", "plot_outcome", "replace_block"]

START, END = "<!-- outcome:start -->", "<!-- outcome:end -->"
HEADLINE = "outcome:headline"


def _seeds(values) -> str:
    return ", ".join(f"{v:.4f}" for v in values)


def outcome_tables(results: dict) -> str:
    """The equal-optimisation and equal-time tables, policies as measured."""
    s = summarize(results)
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
    if "time" in s:
        tp = results["throughput"]
        budget = next(iter(s["time"].values()))["budget_s"]
        out += [
            f"**At equal time** (the same runs, each step priced at its policy's seconds per real "
            f"token, measured {results.get('throughput_date_utc', '')} with the policies taking "
            f"turns step by step; budget: sorted-static's {results['epochs']} epochs, "
            f"{budget:.0f} s at one thread):",
            "",
            "| policy | real tok/s vs sorted-static (median; rounds) | its 3 epochs take | "
            "held-out loss at the budget (mean) | spread | each seed | time to sorted-static's "
            "final loss |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, row in _by_mean(s["time"]):
            ratios = np.asarray(tp[name]["ratio_to_reference"])
            reach = row["time_to_sorted_loss_s"]
            got = [r for r in reach if r is not None]
            when = (
                f"{np.median(got):.0f} s ({len(got)}/{len(reach)} seeds)" if got else "not reached"
            )
            out.append(
                f"| {LABELS.get(name, name)} | {1 / np.median(ratios):.2f} "
                f"({', '.join(f'{1 / r:.2f}' for r in ratios)}) | {np.mean(row['run_s']):.0f} s | "
                f"{row['mean']:.4f} | {row['spread']:.4f} | {_seeds(row['loss'])} | {when} |"
            )
        out.append("")
    return "\n".join(out)


def _cell(row: dict | None) -> str:
    if row is None:
        return "not measured"
    return f"{row['mean']:.3f} ± {row['spread'] / 2:.3f} ({len(row['loss'])} seeds)"


def outcome_headline(results: dict) -> str:
    """The README's table: each policy's final held-out loss per question, mean ± half the
    spread over seeds, best first at equal optimisation."""
    s = summarize(results)
    opt, eq_time = s.get("optimisation", {}), s.get("time", {})
    names = sorted(set(opt) | set(eq_time), key=lambda n: (opt or eq_time)[n]["mean"]
                   if n in (opt or eq_time) else float("inf"))  # fmt: skip
    out = [
        f"`benchmarks/outcome.json` (`make bench-outcome`; the exact commands in BENCHMARKS.md), "
        f"runs from {results['date_utc']}, {results['machine']}; held-out loss in nats per token "
        f"after {results['epochs']} epochs (equal optimisation) or in sorted-static's time (equal "
        "time).",
        "",
        "| policy | equal optimisation | equal time |",
        "|---|---|---|",
    ]
    for n in names:
        out.append(f"| {LABELS.get(n, n)} | {_cell(opt.get(n))} | {_cell(eq_time.get(n))} |")
    return "\n".join(out) + "\n"


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
    equal_time = summarize(results).get("time")
    panels = [("optimisation", "step", "global step (equal optimisation)")]
    if "throughput" in results:
        panels += [
            ("optimisation", "tokens", "real tokens"),
            ("optimisation", "time", "seconds at the measured rate (equal time)"),
        ]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.6), squeeze=False)
    names = list(LABELS)
    cmap = plt.get_cmap("tab10")
    for ax, (q, x, label) in zip(axes[0], panels, strict=True):
        lows = []
        for name, by_seed in runs[q].items():
            if x == "time" and name not in results["throughput"]:
                continue
            rate = results["throughput"][name]["s_per_real_token"] if x == "time" else 1.0
            grid, mean, lo, hi = _curves(by_seed, "step" if x == "step" else "tokens", rate)
            color = cmap(names.index(name) % 10 if name in names else 9)
            ax.plot(grid, mean, color=color, lw=1.4, label=LABELS.get(name, name))
            ax.fill_between(grid, lo, hi, color=color, alpha=0.15, lw=0)
            lows.append(float(mean[len(mean) // 3]))
        if x == "time" and equal_time:
            budget = next(iter(equal_time.values()))["budget_s"]
            ax.axvline(budget, color="k", ls=":", lw=1, label="budget: sorted-static's time")
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


def replace_block(markdown: str, block: str, name: str = "outcome") -> str:
    """`markdown` with the text between the `name` markers replaced by `block`."""
    return tables.replace_block(markdown, block, name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="benchmarks/outcome.json")
    ap.add_argument("--md", default="BENCHMARKS.md")
    ap.add_argument("--png", default="benchmarks/outcome.png")
    ap.add_argument("--readme", default=None, help="also its headline block (README.md)")
    args = ap.parse_args(argv)
    results = json.loads(Path(args.json).read_text())
    plot_outcome(results, args.png)
    md = Path(args.md)
    md.write_text(replace_block(md.read_text(), outcome_tables(results)))
    if args.readme:
        readme = Path(args.readme)
        readme.write_text(replace_block(readme.read_text(), outcome_headline(results), HEADLINE))
    print(
        f"outcome: tables in {md}, plot {args.png}"
        + (f", headline in {args.readme}" if args.readme else "")
    )


if __name__ == "__main__":
    main()
