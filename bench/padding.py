"""Padding and planning: what every batching policy pads, and what planning costs.

    python -m bench.padding --out benchmarks/padding.json [--quick]

Pure numpy on the seed-calibrated preset. Scores come from `pipeline.report` (the simulator
behind `jobs.plan_buckets`): sorted-static, random, HF-style megabatch grouping, the team's six
edges and exact-DP edges for several K and for `num_buckets: auto`, at a fixed micro-batch and at
a token budget (`padding_table`); full batches under the token budget against the batchers users
pick (`bench.fullbatch`); batch recomposition between epochs from the same plans
(`bench.quality`). Planning cost is timed at the preset's size and at ten times it, to show how it
grows with the data. Draws padding.png and recomposition.png beside the JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.common import median_time, run_script
from bench.fullbatch import budget_table, hf_fidelity
from bench.plots import plot_padding, plot_recomposition
from bench.quality import recomposition_section
from pipeline.core.buckets import optimize, optimize_all
from pipeline.core.config import (
    DEFAULT_TOKEN_BUDGET,
    TEAM_EDGES,
    Batching,
    FixedBatching,
    PlanConfig,
    TokenBudgetBatching,
)
from pipeline.core.plan import epoch_plan
from pipeline.core.synthetic import PRESETS, seed902k_lengths
from pipeline.report.policies import auto_search, compare_policies, policy_label

__all__ = ["BATCHINGS", "main", "padding_table", "planning_costs"]

# "micro-batch 32" is the team's fixed batch; the token budget is the config default.
BATCHINGS = {
    "B32": FixedBatching(batch_size=32),
    "T64K": TokenBudgetBatching(token_budget=DEFAULT_TOKEN_BUDGET),
}


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


def measure(args, log) -> dict:
    """Every table of the module docstring on `--samples` of the preset."""
    n = args.samples or (50_000 if args.quick else PRESETS["seed902k"])
    repeats, scale = (2, 4) if args.quick else (5, 10)
    lengths = seed902k_lengths(n).astype(np.int64)
    log(f"padding of every policy on {n:,} samples")
    padding = padding_table(lengths)
    log("full batches under the token budget, and the Hugging Face samplers")
    padding["budget"] = budget_table(lengths, repeats=repeats)
    padding["hf_fidelity"] = hf_fidelity(lengths)
    log(f"planning cost at {n:,} and {n * scale:,} samples")
    big = seed902k_lengths(n * scale).astype(np.int64)
    padding["costs"] = planning_costs({"preset": lengths, "scaled": big}, repeats=repeats)
    log("recomposition between epochs 0 and 1")
    quality = recomposition_section(lengths, padding["batchings"])
    plot_padding(padding, Path(args.plots) / "padding.png")
    plot_recomposition(quality, Path(args.plots) / "recomposition.png")
    return {"padding": padding, "quality": quality}


def main(argv: list[str] | None = None) -> dict:
    def add_args(p):
        p.add_argument("--samples", type=int, help="preset samples (default 902,087)")

    return run_script("bench.padding", __doc__, measure, add_args, argv)


if __name__ == "__main__":
    main()
