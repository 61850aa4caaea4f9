"""Batching policies scored on one set of sample lengths: simulated padding efficiency and steps.

Every policy is scored the same way: each rank's micro-batch is padded to its longest sample
rounded up to `pad_to_multiple_of` (never beyond the bucket's upper edge for bucketed policies),
and efficiency is real tokens / padded slots. Policies: `sorted` (all lengths sorted: the static
upper bound; under a token budget with greedy fill, cut greedily to the budget like fairseq's
`batch_by_size`, the reference for steps too), `random` (one permutation), `megabatch` (HF
`group_by_length` per rank, `peers`), `lhotse` (lhotse-style dynamic bucketing at
max_duration = the budget; token budget only), and bucketed ones (`edges:<name>`,
`optimal:K`) run through the real `epoch_plan`. `auto_search` reports the K that `num_buckets:
auto` picks (`pipeline.core.epochs.auto_edges`). Pure numpy, no per-sample Python loops.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.core.buckets import EdgeTable, optimize_all
from pipeline.core.config import Batching, PlanConfig
from pipeline.core.epochs import auto_edges, simulated_efficiency
from pipeline.core.metrics import micro_batch_padded
from pipeline.core.orders import REPORT_RANDOM_STREAM, length_order
from pipeline.core.plan import EpochPlan, epoch_plan, global_batch_sizes, split_offsets
from pipeline.report.peers import hf_length_grouped, lhotse_style

__all__ = [
    "POLICY_LABELS",
    "policy_label",
    "PolicyScore",
    "AutoResult",
    "fixed_batch_size",
    "sorted_order",
    "random_order",
    "order_score",
    "plan_score",
    "compare_policies",
    "auto_details",
    "auto_search",
]

# Readable names of the policies in reports, tables and plots.
POLICY_LABELS = {
    "sorted": "sorted-static",
    "random": "random",
    "megabatch": "megabatch (HF group_by_length)",
    "edges:team": "team's six edges",
}


def policy_label(name: str, auto_k: int | None = None) -> str:
    """A policy's readable name: `optimal:K` -> "optimal edges, K=K", `optimal:auto` with its K."""
    if name == "optimal:auto":
        return f"optimal edges, auto (K={auto_k})" if auto_k else "optimal edges, auto"
    if name.startswith("optimal:"):
        return f"optimal edges, K={name.split(':')[1]}"
    return POLICY_LABELS.get(name, name)


@dataclass(frozen=True)
class PolicyScore:
    """One policy's simulated padding on the whole epoch."""

    name: str
    real_tokens: int
    padded_tokens: int
    micro_batches: int
    batch_size: int | None  # global samples per step; None: per bucket, from the plan
    steps: int = 0  # global steps of the epoch
    over_budget: int = 0  # global steps whose padded slots exceed the token budget

    @property
    def efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0


@dataclass(frozen=True)
class AutoResult:
    """Outcome of `auto_search`: the chosen K, its efficiency and its neighbour's below."""

    k: int
    edges: list[int]
    efficiency: float
    target: float
    reached: bool  # False: even max_k misses the target; k is then max_k
    below: float | None  # efficiency at K - 1 (None for K = 1); < target when the search is sound


def fixed_batch_size(lengths: np.ndarray, batching: Batching) -> int:
    """Global samples per step for the non-bucketed policies (sorted, random, megabatch).

    `fixed` mode: `batching.batch_size`, the same B as the bucketed plan. `token_budget` mode: a
    fixed-size batcher cannot adapt B to the lengths it draws, so it must size B for the worst case
    under the same memory bound: B = token_budget // max(lengths), rounded like any plan bucket
    (i.e. what the plan gives one bucket spanning all lengths). Bucketed policies instead get the
    plan's per-bucket token-budget batches.
    """
    if batching.mode == "fixed":
        return batching.batch_size
    return int(global_batch_sizes([0, int(np.max(lengths))], batching)[0])


def sorted_order(lengths: np.ndarray) -> np.ndarray:
    """All samples by ascending length, ties by position: the plan's sorted baseline
    (`pipeline.core.plan.length_order`), adjacent batches sharing lengths (the static upper bound)."""
    lengths = np.asarray(lengths)
    return length_order(lengths, np.arange(lengths.size))


def random_order(lengths: np.ndarray, seed: int = 0) -> np.ndarray:
    """One uniformly random permutation of the samples."""
    return np.random.default_rng((seed, REPORT_RANDOM_STREAM)).permutation(np.asarray(lengths).size)


def _micro_offsets(global_sizes: np.ndarray, world_size: int) -> np.ndarray:
    """Flat offsets of every (step, rank) micro-batch, split by the plan's rule (`split_offsets`)."""
    step_offsets = np.concatenate([[0], np.cumsum(np.asarray(global_sizes, dtype=np.int64))])
    mo = split_offsets(step_offsets, world_size)
    return np.concatenate([mo[:, :-1].ravel(), step_offsets[-1:]])


def order_score(
    name: str,
    lengths: np.ndarray,
    order: np.ndarray,
    batch_size: int,
    *,
    world_size: int = 1,
    multiple: int = 1,
    budget: int | None = None,
) -> PolicyScore:
    """Score samples taken in `order`, cut into global batches of `batch_size` (last one partial)
    or of the given sizes, each split over `world_size` ranks; padding is per micro-batch,
    uncapped; steps over `budget` padded slots are counted."""
    lens = np.asarray(lengths, dtype=np.int64)[order]
    n = lens.size
    if np.ndim(batch_size):  # variable global batches (e.g. lhotse-style), given in order
        sizes = np.asarray(batch_size, dtype=np.int64)
    else:
        steps = -(-n // batch_size)
        sizes = np.full(steps, batch_size, dtype=np.int64)
        if steps:
            sizes[-1] = n - batch_size * (steps - 1)
    offsets = _micro_offsets(sizes, world_size)
    mb = micro_batch_padded(lens, offsets, multiple=multiple)
    step_padded = mb.reshape(sizes.size, world_size).sum(axis=1)
    over = int((step_padded > budget).sum()) if budget else 0
    fixed = None if np.ndim(batch_size) else batch_size
    return PolicyScore(
        name, int(lens.sum()), int(mb.sum()), offsets.size - 1, fixed, sizes.size, over
    )


def plan_score(name: str, plan: EpochPlan) -> PolicyScore:
    """Score an epoch plan's micro-batches, padding capped at each step's bucket upper edge."""
    lens, offsets = plan.micro_batch_lengths()
    padded = plan.micro_batch_padded().sum()
    return PolicyScore(name, int(lens.sum()), int(padded), offsets.size - 1, None, plan.num_steps)


def compare_policies(
    lengths: np.ndarray,
    edge_sets: Mapping[str, Sequence[int]],
    *,
    batching: Batching,
    world_size: int = 1,
    seed: int = 0,
    epoch: int = 0,
    plan: PlanConfig | None = None,
) -> list[PolicyScore]:
    """sorted, random, megabatch, [lhotse,] then one bucketed policy per named edge list.

    Under a token budget with greedy fill, `sorted` and `random` are cut greedily to the same
    budget (sorted: fairseq's `batch_by_size`, the reference for steps and padding) and `lhotse`
    adds lhotse-style dynamic bucketing at max_duration = budget; otherwise they use the fixed
    batch of `fixed_batch_size`. `megabatch` is HF `group_by_length` with B // world_size samples
    per rank (`peers.hf_length_grouped`, held to the real samplers by a test).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    B = fixed_batch_size(lengths, batching)
    kw = dict(world_size=world_size, multiple=batching.pad_to_multiple_of)
    plan_cfg = (plan or PlanConfig()).model_copy(update={"seed": seed})
    # The epoch number perturbs the non-bucketed permutations too, like a per-epoch reshuffle.
    s = (seed, epoch)
    if batching.mode == "token_budget" and batching.fill == "greedy":
        top = [0, int(lengths.max())]
        base = dict(batching=batching, world_size=world_size, epoch=epoch)
        scores = [
            plan_score(p, epoch_plan(lengths, top, **base, plan=PlanConfig(policy=p, seed=seed)))
            for p in ("sorted", "random")
        ]
    else:
        scores = [
            order_score("sorted", lengths, sorted_order(lengths), B, **kw),
            order_score("random", lengths, random_order(lengths, s), B, **kw),
        ]
    per_rank = max(1, B // world_size)
    ids, offsets, steps = hf_length_grouped(lengths, per_rank, world_size, s)
    hf_padded = micro_batch_padded(lengths[ids], offsets, multiple=batching.pad_to_multiple_of)
    scores.append(
        PolicyScore(
            "megabatch",
            int(lengths[ids].sum()),
            int(hf_padded.sum()),
            offsets.size - 1,
            per_rank * world_size,
            steps,
        )
    )
    if batching.mode == "token_budget":
        budget = batching.token_budget
        order, sizes = lhotse_style(lengths, budget, 32, seed, epoch)
        scores.append(order_score("lhotse", lengths, order, sizes, **kw, budget=budget))
    for name, edges in edge_sets.items():
        p = epoch_plan(
            lengths,
            edges,
            batching=batching,
            world_size=world_size,
            epoch=epoch,
            plan=plan_cfg,
        )
        scores.append(plan_score(name, p))
    return scores


def auto_details(
    lengths: np.ndarray,
    edges: list[int],
    batching: Batching,
    *,
    target: float,
    world_size: int = 1,
    plan: PlanConfig | None = None,
    table: EdgeTable | None = None,
) -> AutoResult:
    """What the `auto` edges a run resolved (`pipeline.core.epochs.resolve_edges`) reach: their K,
    their simulated efficiency and, since efficiency is only near-monotone in K, the efficiency
    at K - 1 (a value at or above the target there would expose a wiggle the search stepped
    over)."""
    plan_cfg = plan or PlanConfig()
    k = len(edges) - 1
    eff = simulated_efficiency(lengths, edges, batching, plan_cfg, world_size)
    below = None
    if k > 1:
        table = table if table is not None and max(table.edges) >= k else optimize_all(lengths, k)
        below = simulated_efficiency(lengths, table.for_k(k - 1), batching, plan_cfg, world_size)
    return AutoResult(k, list(edges), eff, target, eff >= target, below)


def auto_search(
    lengths: np.ndarray,
    batching: Batching,
    *,
    target: float = 0.97,
    max_k: int = 64,
    world_size: int = 1,
    seed: int = 0,
    plan: PlanConfig | None = None,
    table: EdgeTable | None = None,
    max_floor: float | None = None,
) -> AutoResult:
    """The K that `buckets.num_buckets: auto` gives training (`pipeline.core.epochs.auto_edges`,
    a doubling and bisection search over K, each candidate scored on a real epoch-0 plan), with
    `auto_details`."""
    plan_cfg = (plan or PlanConfig()).model_copy(update={"seed": seed})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a missed target is reported in the result instead
        edges = auto_edges(lengths, batching, plan_cfg, target, max_k, world_size, max_floor)
    return auto_details(
        lengths, edges, batching, target=target, world_size=world_size, plan=plan_cfg, table=table
    )
