"""Benchmark section 1: padding efficiency of every batching policy, and what planning costs.

Scores come from `pipeline.report` (the same simulator as `jobs.plan_buckets`): sorted-static,
random, HF-style megabatch grouping, the team's six edges and exact-DP edges for several K and
for `num_buckets: auto`, at a fixed micro-batch and at a token budget. Planning cost is timed
at the preset's size and at ten times it, to show how it grows with the data.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from pipeline.core.buckets import optimize, optimize_all
from pipeline.core.config import (
    TEAM_EDGES,
    Batching,
    FixedBatching,
    PlanConfig,
    TokenBudgetBatching,
)
from pipeline.core.plan import epoch_plan
from pipeline.report.policies import auto_search, compare_policies, policy_label

__all__ = ["BATCHINGS", "padding_table", "planning_costs", "median_time"]

# "micro-batch 32" is the team's fixed batch; 65,536 padded tokens per step is the config default.
BATCHINGS = {
    "B32": FixedBatching(batch_size=32),
    "T64K": TokenBudgetBatching(token_budget=65_536),
}


def median_time(fn: Callable, repeats: int) -> tuple[float, list[float], object]:
    """(median seconds, every run's seconds, the last result) of `repeats` calls of `fn`."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return float(statistics.median(times)), times, out


def padding_table(
    lengths: np.ndarray,
    *,
    ks: Sequence[int] = (6, 16, 32),
    batchings: dict[str, Batching] = BATCHINGS,
    target: float = 0.97,
    max_k: int = 64,
    seed: int = 0,
) -> dict:
    """Per batching: every policy's real/padded tokens, efficiency and ratio to sorted-static.

    World size 1, so a global batch is one micro-batch; `optimal:auto` is the K that
    `buckets.num_buckets: auto` would train with under that batching.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    table = optimize_all(lengths, max(max(ks), 1))
    out: dict = {"samples": int(lengths.size), "tokens": int(lengths.sum()), "batchings": {}}
    for name, batching in batchings.items():
        auto = auto_search(lengths, batching, target=target, max_k=max_k, seed=seed)
        edge_sets = {}
        if lengths.max() <= TEAM_EDGES[-1]:
            edge_sets["edges:team"] = TEAM_EDGES
        edge_sets |= {f"optimal:{k}": table.for_k(k) for k in ks}
        edge_sets["optimal:auto"] = auto.edges
        scores = compare_policies(lengths, edge_sets, batching=batching, seed=seed)
        sorted_eff = scores[0].efficiency
        out["batchings"][name] = {
            "batching": batching.model_dump(),
            "auto": {"k": auto.k, "efficiency": auto.efficiency, "target": target},
            "policies": [
                {
                    "name": s.name,
                    "label": policy_label(s.name, auto.k),
                    "efficiency": s.efficiency,
                    "vs_sorted": s.efficiency / sorted_eff,
                    "real_tokens": s.real_tokens,
                    "padded_tokens": s.padded_tokens,
                    "micro_batches": s.micro_batches,
                    "edges": edge_sets.get(s.name),
                }
                for s in scores
            ],
        }
    return out


def planning_costs(
    sizes: dict[str, np.ndarray],
    *,
    k: int = 32,
    batching: Batching = BATCHINGS["T64K"],
    world_size: int = 8,
    repeats: int = 3,
) -> dict:
    """Per named set of lengths: median seconds of `optimize(lengths, k)` and of one epoch plan
    (the bucketed policy with those edges, `world_size` ranks)."""
    rows = {}
    for name, lengths in sizes.items():
        opt_s, opt_all, edges = median_time(lambda lengths=lengths: optimize(lengths, k), repeats)
        plan_s, plan_all, plan = median_time(
            lambda lengths=lengths, edges=edges: epoch_plan(
                lengths,
                edges,
                epoch=0,
                world_size=world_size,
                batching=batching,
                plan=PlanConfig(),
            ),
            repeats,
        )
        rows[name] = {
            "samples": int(np.asarray(lengths).size),
            "tokens": int(np.asarray(lengths, dtype=np.int64).sum()),
            "optimize_s": opt_s,
            "optimize_s_all": opt_all,
            "plan_s": plan_s,
            "plan_s_all": plan_all,
            "steps": plan.num_steps,
        }
    return {
        "k": k,
        "world_size": world_size,
        "batching": batching.model_dump(),
        "repeats": repeats,
        "sizes": rows,
    }
