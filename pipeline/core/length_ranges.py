"""Length ranges for reporting: how a run's loss is told apart by document length (pure numpy).

Packed rows mix every length in every step, so a packed run has one bucket and its step loss
says nothing about lengths. The loss of each step's documents is still split by their length,
into a few ranges cut from the training lengths by the same minimum-padding dynamic programme
the bucket edges use (`pipeline.core.buckets.optimize`): where the distribution has its mass,
the ranges are narrow. `REPORT_RANGES` ranges keep the picture readable (one curve each) and
give every range enough tokens per step for a curve with a point at every step.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.buckets import optimize

__all__ = ["REPORT_RANGES", "range_label", "report_ranges", "run_ranges"]

# Ranges a run's loss is reported by: more would draw curves too noisy to read per step.
REPORT_RANGES = 4


def report_ranges(lengths: np.ndarray, top: int, k: int = REPORT_RANGES) -> list[int]:
    """Edges [0, e1, ..., top] of at most `k` length ranges (range r holds lengths in
    (e_r, e_r+1]), cut by minimum padding from the training `lengths`; lengths above `top`
    (cut at the top edge when trained) count as `top`. Fewer distinct lengths than `k`: one
    range per length. [] for no lengths."""
    x = np.minimum(np.asarray(lengths, dtype=np.int64), int(top))
    x = x[x >= 1]
    if x.size == 0:
        return []
    edges = [int(e) for e in optimize(x, max(1, int(k)))]
    edges[-1] = max(edges[-1], int(top))
    return edges


def run_ranges(lengths: np.ndarray, edges: list[int]) -> list[int]:
    """The length ranges a run reports its training loss by: `report_ranges` where the run
    trains one bucket (packed rows, or a baseline batching across all lengths), whose steps each
    mix every length; [] where it has buckets, whose steps each hold one length range already
    (the bucket of the step, with its own loss curve)."""
    return report_ranges(lengths, edges[-1]) if len(edges) == 2 else []


def range_label(edges: list[int], r: int) -> str:
    """`lo-hi` in tokens for range r of `edges` (the lengths it holds, both ends included)."""
    return f"{int(edges[r]) + 1}-{int(edges[r + 1])}"
