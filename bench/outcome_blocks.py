"""The outcome's tables (`bench.outcome`'s JSON, `r["outcome"]`), one function per block of
BENCHMARKS.md (`ran`, `optimisation`, `time`) and the README's (`headline`); `bench.tables` puts
them in the documents with the other blocks. Cells hold figures and names, never sentences."""

from __future__ import annotations

import numpy as np

from bench.outcome import speed_vs_sorted, summarize
from bench.outcome_policies import LABELS
from bench.table_blocks import columns

__all__ = ["headline", "optimisation", "ran", "time"]


def _seeds(values) -> str:
    return ", ".join(f"{v:.4f}" for v in values)


def _by_mean(table: dict):
    return sorted(table.items(), key=lambda kv: kv[1]["mean"])


def ran(r: dict) -> str:
    """Which commands, machine and dates the outcome's figures come from, and its setting."""
    o = r["outcome"]
    seeds = sorted(
        {s for q in summarize(o).values() for x in q.values() for s in x["seeds"]}, key=int
    )
    row = o | {
        "command": f"`{o['command'].strip()}`",
        "defs": f"{o['corpus']['train_samples']:,} / {o['corpus']['heldout_samples']:,}",
        "seeds": ", ".join(seeds),
    }
    return columns(
        "measured by=command | runs from=date_utc | throughput measured=throughput_date_utc"
        " | machine=machine | training / held-out definitions=defs | held-out tokens=heldout_tokens:,"
        " | epochs=epochs | held-out loss every (steps)=eval_every | seeds=seeds"
        " | samples per step (equal optimisation)=batch_size",
        [row],
    )


def optimisation(r: dict) -> str:
    """Held-out loss after the same steps of the same samples per step, best first."""
    rows = [
        x | {"policy": LABELS.get(n, n), "each": _seeds(x["loss"]), "n": int(np.mean(x["steps"]))}
        for n, x in _by_mean(summarize(r["outcome"]).get("optimisation", {}))
    ]
    return columns(
        "policy=policy | held-out loss (mean)=mean:.4f | spread over seeds=spread:.4f"
        " | each seed=each | loss per sample (mean)=loss_per_sample_mean:.4f | steps=n",
        rows,
    )


def time(r: dict) -> str:
    """Held-out loss at sorted-static's time, each step priced at its policy's measured rate."""
    o = r["outcome"]
    s = summarize(o).get("time")
    if not s:
        return columns("equal time=x", [{"x": "not measured"}])
    rows = []
    for n, x in _by_mean(s):
        speed, rounds = speed_vs_sorted(o["throughput"][n])
        got = [t for t in x["time_to_sorted_loss_s"] if t is not None]
        reach = (
            f"{np.median(got):.0f} s ({len(got)}/{len(x['loss'])} seeds)" if got else "not reached"
        )
        rows.append(
            x
            | {"policy": LABELS.get(n, n), "each": _seeds(x["loss"]), "reach": reach}
            | {"speed": f"{speed:.2f} ({', '.join(f'{v:.2f}' for v in rounds)})"}
            | {"run": f"{np.mean(x['run_s']):.0f} s"}
        )
    budget = next(iter(s.values()))["budget_s"]
    return columns(
        "policy=policy | real tok/s vs sorted-static (median; rounds)=speed"
        f" | its {o['epochs']} epochs take=run | held-out loss at {budget:.0f} s (mean)=mean:.4f"
        " | spread=spread:.4f | each seed=each | time to sorted-static's final loss=reach",
        rows,
    )


def _cell(row: dict | None) -> str:
    if row is None:
        return "not measured"
    return f"{row['mean']:.3f} ± {row['spread'] / 2:.3f} ({len(row['loss'])} seeds)"


def headline(r: dict) -> str:
    """The README's table: each policy's final held-out loss per question, mean ± half the
    spread over seeds, best first at equal optimisation; then where the figures come from."""
    o = r["outcome"]
    s = summarize(o)
    opt, eq_time = s.get("optimisation", {}), s.get("time", {})
    first = opt or eq_time
    names = sorted(set(opt) | set(eq_time), key=lambda n: first[n]["mean"] if n in first else 1e9)
    rows = [
        {"policy": LABELS.get(n, n), "opt": _cell(opt.get(n)), "time": _cell(eq_time.get(n))}
        for n in names
    ]
    source = {
        "figures": "outcome",
        "link": "[BENCHMARKS.md](BENCHMARKS.md#outcome-held-out-loss)",
        "rerun": "`make bench-outcome`",
    }
    return (
        columns("policy=policy | equal optimisation=opt | equal time=time", rows)
        + "\n\n"
        + columns(
            "figures=figures | runs from=date_utc | machine=machine | epochs=epochs"
            " | commands=link | rerun with=rerun",
            [o | source],
        )
    )
