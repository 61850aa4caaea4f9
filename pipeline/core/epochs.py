"""From config and length index to bucket edges and epoch plans: the driver- and worker-side glue.

`resolve_edges` honours explicit edges, a fixed K, or `auto`: the smallest K whose simulated
padding efficiency (each micro-batch padded to its own max, rounded as the collator does) reaches
buckets.target_efficiency. The simulation plans a real epoch for each candidate K, so it measures
what training will see, including token-budget batch sizes and the split over ranks. With
buckets.max_recomposition_floor, K is also capped at the largest K whose recomposition chance
floor (`pipeline.core.frontier`) stays within it: narrow buckets re-pair samples across epochs.

With batching.mode=packed, `epoch_plan_for` packs the epoch (`pipeline.core.packing.pack_epoch`)
and `auto` means one bucket, a full shuffle: packing fills rows from every length, and rows
packed within narrow buckets fill worse (docs/architecture.md, "Packed rows"). Explicit edges or
a fixed K pack within buckets. Under a baseline plan.policy (sorted, random, ...), which batches
across all lengths, `auto` is one bucket too.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np

from pipeline.core.buckets import optimize, optimize_all, validate_edges
from pipeline.core.chapters import row_group_of
from pipeline.core.config import Batching, PackedBatching, PlanConfig, RunConfig
from pipeline.core.frontier import epoch0_efficiency, plan_point
from pipeline.core.modelfields import model_width
from pipeline.core.packing import PackingSpec, attention_width_for, packed_summary
from pipeline.core.plan import EpochPlan
from pipeline.core.windows import sample_windows, windowed_epoch_plan, windowed_pack_epoch

__all__ = [
    "resolve_edges",
    "auto_edges",
    "simulated_efficiency",
    "epoch_plan_for",
    "epoch_windows",
    "packed_epoch_metrics",
    "packing_spec",
    "run_epoch_plans",
]


def simulated_efficiency(
    lengths: np.ndarray, edges, batching: Batching, plan_cfg: PlanConfig, world_size: int
) -> float:
    """Real / padded tokens of epoch 0 planned with `edges`, batch-max padding per micro-batch."""
    return epoch0_efficiency(lengths, edges, batching, plan_cfg, world_size)[1]


def auto_edges(
    lengths: np.ndarray,
    batching: Batching,
    plan_cfg: PlanConfig,
    target: float,
    max_k: int,
    world_size: int,
    max_floor: float | None = None,
) -> list[int]:
    """Smallest K in 1..max_k whose optimal edges reach `target` simulated efficiency.

    Efficiency rises with K almost monotonically (more buckets, tighter batches), so a doubling
    search followed by bisection plans O(log max_k) epochs instead of max_k; if even max_k
    misses the target, its edges are returned with a warning. With `max_floor`, a K whose
    recomposition floor exceeds it is replaced by the largest K below it that stays within it
    (the floor grows with K, so again by bisection), with a warning that the target yields.
    """
    table = optimize_all(lengths, max_k)
    kmax = max(table.edges)
    memo: dict[int, tuple[float, float]] = {}

    def point(k: int) -> tuple[float, float]:
        if k not in memo:
            p = plan_point(lengths, table.for_k(k), batching, plan_cfg, world_size)
            memo[k] = (p.efficiency, p.floor)
        return memo[k]

    def eff(k: int) -> float:
        return point(k)[0]

    k = _smallest_k_reaching(eff, target, kmax)
    if max_floor is not None and point(k)[1] > max_floor:
        k = _largest_k_within(lambda j: point(j)[1], max_floor, k)
        warnings.warn(
            f"buckets: max_recomposition_floor={max_floor} caps K at {k} (floor "
            f"{point(k)[1]:.3f}, padding efficiency {eff(k):.3f}, target {target}); raise the "
            "ceiling or lower target_efficiency to trade the other way",
            stacklevel=2,
        )
    return table.for_k(k)


def _largest_k_within(floor, ceiling: float, hi: int) -> int:
    """Largest K in 1..hi - 1 with floor(K) <= ceiling (1 if none), by bisection."""
    lo = 1
    if floor(lo) > ceiling:
        return lo
    while hi - lo > 1:  # floor(lo) <= ceiling < floor(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if floor(mid) <= ceiling else (lo, mid)
    return lo


def _smallest_k_reaching(eff, target: float, kmax: int) -> int:
    """The doubling-then-bisection search of `auto_edges` (kmax with a warning if missed)."""
    lo, hi = 0, 1  # eff(lo) < target (lo = 0: none tried), eff(hi) >= target once found
    while hi < kmax and eff(hi) < target:
        lo, hi = hi, min(2 * hi, kmax)
    if eff(hi) < target:
        warnings.warn(
            f"buckets: even {kmax} buckets reach only {eff(hi):.3f} padding efficiency "
            f"< buckets.target_efficiency={target}; using {kmax}. Lower the target or raise "
            "buckets.max_buckets",
            stacklevel=3,
        )
        return kmax
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if eff(mid) >= target else (mid, hi)
    return hi


def resolve_edges(cfg: RunConfig, lengths: np.ndarray) -> list[int]:
    """buckets.edges (validated against the data), or optimal edges for buckets.num_buckets / auto."""
    lengths = np.asarray(lengths)
    if cfg.buckets.edges is not None:
        return validate_edges(cfg.buckets.edges, lengths).tolist()
    if lengths.size == 0:
        raise ValueError("no valid samples to choose bucket edges from (all rows quarantined?)")
    k = cfg.buckets.num_buckets
    if k == "auto" and isinstance(cfg.batching, PackedBatching):
        return optimize(lengths, 1)  # one bucket: a full shuffle (module docstring)
    if k == "auto" and cfg.plan.policy != "bucketed":
        return optimize(lengths, 1)  # the baselines batch across all lengths: nothing to search
    if k != "auto":
        return optimize(lengths, int(k))
    return auto_edges(
        lengths,
        cfg.batching,
        cfg.plan,
        cfg.buckets.target_efficiency,
        cfg.buckets.max_buckets,
        cfg.scaling.num_workers,
        cfg.buckets.max_recomposition_floor,
    )


def packing_spec(cfg: RunConfig) -> PackingSpec:
    """How batching.mode=packed packs an epoch (every field is part of the plan hash)."""
    b = cfg.batching
    if not isinstance(b, PackedBatching):
        raise ValueError(f"batching.mode={b.mode} packs nothing: set batching.mode=packed")
    return PackingSpec(
        row_tokens=b.row_tokens,
        rows_per_step=b.rows_per_step,
        attention_width=b.attention_width or attention_width_for(model_width(cfg.model)),
        open_rows=b.open_rows,
        balance_rows=b.balance_rows,
        longest_first=cfg.plan.longest_first,
    )


def epoch_plan_for(cfg: RunConfig, index, edges, epoch: int, world_size: int) -> EpochPlan:
    """The epoch's plan over the index's valid samples (same on driver, feeder and workers):
    packed rows with batching.mode=packed, padded global batches otherwise; seeded by
    plan.seed; with plan.window_tokens, planned window by window (`pipeline.core.windows`)."""
    window = epoch_windows(cfg, index, epoch)
    if isinstance(cfg.batching, PackedBatching):
        return windowed_pack_epoch(
            index.lengths,
            edges,
            window=window,
            seed=cfg.plan.seed,
            epoch=epoch,
            world_size=world_size,
            spec=packing_spec(cfg),
            sample_ids=index.sample_ids,
            pad_to_multiple_of=cfg.batching.pad_to_multiple_of,
        )
    return windowed_epoch_plan(
        index.lengths,
        edges,
        window=window,
        epoch=epoch,
        world_size=world_size,
        batching=cfg.batching,
        plan=cfg.plan,
        sample_ids=index.sample_ids,
    )


def epoch_windows(cfg: RunConfig, index, epoch: int) -> np.ndarray:
    """Each valid sample's window in `epoch` (all zeros without plan.window_tokens): its row
    group's, from the index's files, rows and row groups."""
    n = int(np.asarray(index.lengths).size)
    if cfg.plan.window_tokens is None:
        return np.zeros(n, dtype=np.int64)
    rg = row_group_of(index.file_idx, index.rows, index.row_groups)
    return sample_windows(
        index.lengths,
        rg,
        cfg.plan.window_tokens,
        seed=cfg.plan.seed,
        epoch=epoch,
        longest_first=cfg.plan.longest_first,
        num_row_groups=sum(len(r) for r in index.row_groups),
    )


def packed_epoch_metrics(plan: EpochPlan) -> dict:
    """`epoch/*` metrics of a packed plan ({} for a padded one): rows, documents per row, row
    fill (also the planned padding efficiency: a row's empty tail is its only padding), and rank
    balance under the cost model (the sum over steps of the costliest rank over the mean rank,
    and useful / paid work, `pipeline.core.packing.packed_summary`)."""
    if not plan.packed:
        return {}
    s = packed_summary(plan)
    return {
        "epoch/rows": s["rows"],
        "epoch/docs_per_row": s["docs_per_row"],
        "epoch/row_fill": s["row_fill"],
        "epoch/planned_padding_efficiency": s["row_fill"],
        "epoch/rank_max_over_mean": s["rank_max_over_mean"],
        "epoch/useful_over_paid": s["useful_over_paid"],
    }


def run_epoch_plans(cfg: RunConfig, index, edges, world_size: int) -> Iterator[EpochPlan]:
    """The plan of every epoch the run reaches: train.epochs of them, fewer when train.max_steps
    ends the run earlier (with greedy fill, epochs differ slightly in their step counts)."""
    steps = 0
    for epoch in range(cfg.train.epochs):
        if cfg.train.max_steps is not None and steps >= cfg.train.max_steps:
            return
        plan = epoch_plan_for(cfg, index, edges, epoch, world_size)
        steps += plan.num_steps
        yield plan
