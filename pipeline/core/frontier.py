"""The number of buckets K trades padding against fresh batch composition: the frontier.

More buckets pad less (tighter length ranges) but make each bucket's pool of samples smaller,
so a fresh within-bucket shuffle re-pairs some samples of the last epoch by chance. A
micro-batch of m samples holds m(m-1)/2 pairs, and each pair shared a micro-batch last epoch
with probability ~(m' - 1)/(n - 1) (m' the bucket's mean micro-batch size, n its samples), so the
expected share of micro-batches repeating a pair -- the recomposition chance floor -- is the
mean of 1 - exp(-m(m-1)/2 x (m'-1)/(n-1)) over non-empty micro-batches (the benchmarks'
recomposition tables give it at world size 1). `plan_point` scores one K on a real epoch-0 plan
(padding efficiency, steps, floor); `frontier` sweeps K (`pipeline.report.plot.plot_frontier`
draws it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from pipeline.core.buckets import EdgeTable, optimize_all
from pipeline.core.config import Batching, PlanConfig
from pipeline.core.plan import EpochPlan, epoch_plan

__all__ = ["FrontierPoint", "recomposition_floor", "plan_point", "frontier", "frontier_ks"]


@dataclass(frozen=True)
class FrontierPoint:
    k: int
    efficiency: float  # simulated padding efficiency of the epoch-0 plan
    steps: int  # its global steps
    floor: float  # its recomposition chance floor
    edges: list[int]

    def to_dict(self) -> dict:
        return asdict(self)


def recomposition_floor(plan: EpochPlan) -> float:
    """Expected share of the plan's non-empty micro-batches that repeat a pair of last epoch's
    micro-batch partners under a fresh within-bucket shuffle."""
    sizes = np.diff(plan.micro_offsets, axis=1).ravel().astype(np.float64)
    b = plan.micro_batch_buckets()
    nonempty = sizes > 0
    if not nonempty.any():
        return 0.0
    K = plan.num_buckets
    n = np.bincount(b, weights=sizes, minlength=K)
    mean_m = n / np.maximum(np.bincount(b[nonempty], minlength=K), 1)
    p_pair = np.maximum(mean_m[b] - 1, 0) / np.maximum(n[b] - 1, 1)
    pairs = sizes * (sizes - 1) / 2
    return float(np.mean(1 - np.exp(-pairs * p_pair)[nonempty]))


def epoch0_efficiency(
    lengths: np.ndarray, edges, batching: Batching, plan_cfg: PlanConfig, world_size: int
) -> tuple[EpochPlan, float]:
    """The epoch-0 plan with `edges`, and its real / padded tokens with batch-max padding per
    micro-batch (never beyond the bucket's upper edge)."""
    plan = epoch_plan(
        lengths,
        edges,
        epoch=0,
        world_size=world_size,
        batching=batching,
        plan=plan_cfg,
    )
    return plan, plan.planned_padding_efficiency()


def plan_point(
    lengths: np.ndarray, edges, batching: Batching, plan_cfg: PlanConfig, world_size: int
) -> FrontierPoint:
    """Efficiency, steps and recomposition floor of epoch 0 planned with `edges`."""
    plan, eff = epoch0_efficiency(lengths, edges, batching, plan_cfg, world_size)
    edges = [int(e) for e in edges]
    return FrontierPoint(len(edges) - 1, eff, plan.num_steps, recomposition_floor(plan), edges)


def frontier_ks(max_k: int) -> list[int]:
    """Every K up to 16, then every 4th, and max_k."""
    return sorted(set(range(1, min(16, max_k) + 1)) | set(range(20, max_k + 1, 4)) | {max_k})


def frontier(
    lengths: np.ndarray,
    batching: Batching,
    plan_cfg: PlanConfig,
    world_size: int,
    ks,
    table: EdgeTable | None = None,
) -> list[FrontierPoint]:
    """`plan_point` for each K in `ks`, on optimal edges."""
    ks = sorted(set(int(k) for k in ks))
    if table is None or max(table.edges) < ks[-1]:
        table = optimize_all(lengths, ks[-1])
    return [plan_point(lengths, table.for_k(k), batching, plan_cfg, world_size) for k in ks]
