"""From config and length index to bucket edges and epoch plans: the driver- and worker-side glue.

`resolve_edges` honours explicit edges, a fixed K, or `auto`: the smallest K whose simulated
padding efficiency (each micro-batch padded to its own max, rounded as the collator does) reaches
buckets.target_efficiency. The simulation plans a real epoch for each candidate K, so it measures
what training will see, including token-budget batch sizes and the split over ranks.
"""

from __future__ import annotations

import warnings

import numpy as np

from pipeline.core.buckets import optimize, optimize_all, validate_edges
from pipeline.core.config import Batching, PlanConfig, RunConfig
from pipeline.core.metrics import padding_efficiency
from pipeline.core.plan import EpochPlan, epoch_plan

__all__ = ["resolve_edges", "auto_edges", "simulated_efficiency", "epoch_plan_for"]


def simulated_efficiency(
    lengths: np.ndarray, edges, batching: Batching, plan_cfg: PlanConfig, world_size: int
) -> float:
    """Real / padded tokens of epoch 0 planned with `edges`, batch-max padding per micro-batch."""
    plan = epoch_plan(
        lengths,
        edges,
        seed=plan_cfg.seed,
        epoch=0,
        world_size=world_size,
        batching=batching,
        plan=plan_cfg,
    )
    lens, offsets = plan.micro_batch_lengths()
    cap = np.asarray(edges)[1:][plan.micro_batch_buckets()]
    return padding_efficiency(lens, offsets, multiple=batching.pad_to_multiple_of, cap=cap)


def auto_edges(
    lengths: np.ndarray,
    batching: Batching,
    plan_cfg: PlanConfig,
    target: float,
    max_k: int,
    world_size: int,
) -> list[int]:
    """Smallest K in 1..max_k whose optimal edges reach `target` simulated efficiency.

    Efficiency rises with K almost monotonically (more buckets, tighter batches), so a doubling
    search followed by bisection plans O(log max_k) epochs instead of max_k; if even max_k
    misses the target, its edges are returned with a warning.
    """
    table = optimize_all(lengths, max_k)
    kmax = max(table.edges)
    memo: dict[int, float] = {}

    def eff(k: int) -> float:
        if k not in memo:
            memo[k] = simulated_efficiency(lengths, table.for_k(k), batching, plan_cfg, world_size)
        return memo[k]

    lo, hi = 0, 1  # eff(lo) < target (lo = 0: none tried), eff(hi) >= target once found
    while hi < kmax and eff(hi) < target:
        lo, hi = hi, min(2 * hi, kmax)
    if eff(hi) < target:
        warnings.warn(
            f"buckets: even {kmax} buckets reach only {eff(hi):.3f} padding efficiency "
            f"< buckets.target_efficiency={target}; using {kmax}. Lower the target or raise "
            "buckets.max_buckets",
            stacklevel=2,
        )
        return table.for_k(kmax)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if eff(mid) >= target else (mid, hi)
    return table.for_k(hi)


def resolve_edges(cfg: RunConfig, lengths: np.ndarray) -> list[int]:
    """buckets.edges (validated against the data), or optimal edges for buckets.num_buckets / auto."""
    lengths = np.asarray(lengths)
    if cfg.buckets.edges is not None:
        return validate_edges(cfg.buckets.edges, lengths).tolist()
    if lengths.size == 0:
        raise ValueError("no valid samples to choose bucket edges from (all rows quarantined?)")
    k = cfg.buckets.num_buckets
    if k != "auto":
        return optimize(lengths, int(k))
    return auto_edges(
        lengths,
        cfg.batching,
        cfg.plan,
        cfg.buckets.target_efficiency,
        cfg.buckets.max_buckets,
        cfg.scaling.num_workers,
    )


def epoch_plan_for(cfg: RunConfig, index, edges, epoch: int, world_size: int) -> EpochPlan:
    """The epoch's plan over the index's valid samples (same on driver, feeder and workers)."""
    return epoch_plan(
        index.lengths,
        edges,
        seed=cfg.plan.seed,
        epoch=epoch,
        world_size=world_size,
        batching=cfg.batching,
        plan=cfg.plan,
        sample_ids=index.sample_ids,
    )
