"""Shared pieces of the BENCHMARKS.md renderers: goals, policy names and Markdown helpers.

The seam between the section renderers (`render`, `render_training`, `render_quality`,
`render_first_step`): they share only what `__all__` names here, and each exports its sections.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "GOAL_VS_SORTED",
    "RECOMPOSITION_TARGET",
    "READABILITY_GOAL",
    "POLICY_NAMES",
    "pct",
    "num",
    "table",
    "policy_name",
    "plural",
    "thousands",
    "rel_link",
    "by_name",
    "rss_pair",
]

# The bucketed policy's throughput goal, and the recomposition target.
GOAL_VS_SORTED = 0.93
RECOMPOSITION_TARGET = 0.01
# Real text: the bucket-debiased loss should vary at most half as much step to step as the raw.
READABILITY_GOAL = 0.5
POLICY_NAMES = {
    "sorted": "sorted-static",
    "random": "random",
    "megabatch": "megabatch (HF `group_by_length`)",
    "edges:team": "team's six edges",
}


def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def num(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def policy_name(name: str, auto_k: int | None = None) -> str:
    if name == "optimal:auto":
        return f"optimal edges, auto (K={auto_k})" if auto_k else "optimal edges, auto"
    if name.startswith("optimal:"):
        return f"optimal edges, K={name.split(':')[1]}"
    return POLICY_NAMES.get(name, name)


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def thousands(n: int) -> str:
    return f"{n / 1000:.0f}K" if n >= 10_000 else f"{n:,}"


def rel_link(path: str, doc: str) -> str:
    return os.path.relpath(path, Path(doc).parent or ".")


def by_name(rows: list[dict]) -> dict:
    return {x["name"]: x for x in rows}


def rss_pair(c: dict) -> str:
    """ "feeder (private) / driver" peak RSS in MB; the feeder's private share where measured
    (the rest is shared: object-store pages it wrote, row-cache files it mapped)."""
    private = c.get("feeder_peak_private_bytes")
    feeder = f"{c['feeder_peak_rss_bytes'] / 1e6:,.0f}"
    if private is not None:
        feeder += f" ({private / 1e6:,.0f})"
    return f"{feeder} / {c['driver_peak_rss_bytes'] / 1e6:,.0f}"
