"""Padding report: simulated padding efficiency of batching policies on one set of sample lengths.

Every policy is scored the same way: each rank's micro-batch is padded to its longest sample
rounded up to `pad_to_multiple_of` (never beyond the bucket's upper edge for bucketed policies),
and efficiency is real tokens / padded slots. Policies: `sorted` (all lengths sorted: the static
upper bound; under a token budget with greedy fill, cut greedily to the budget like fairseq's
`batch_by_size`, the reference for steps too), `random` (one permutation), `megabatch` (HF
`group_by_length` per rank, `pipeline.core.peers`), `lhotse` (lhotse-style dynamic bucketing at
max_duration = the budget; token budget only), and bucketed ones (`edges:<name>`,
`optimal:K`) run through the real `epoch_plan`. `auto_search` reports the K that `num_buckets:
auto` picks (`pipeline.core.epochs.auto_edges`). Pure numpy, no per-sample Python loops.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from pipeline.core.buckets import EdgeTable, optimize_all, padded_to_edges
from pipeline.core.config import TEAM_EDGES, Batching, PlanConfig
from pipeline.core.epochs import auto_edges, simulated_efficiency
from pipeline.core.frontier import frontier
from pipeline.core.metrics import micro_batch_padded
from pipeline.core.peers import hf_length_grouped, lhotse_style
from pipeline.core.plan import (
    EpochPlan,
    epoch_plan,
    global_batch_sizes,
    length_order,
    split_offsets,
)
from pipeline.core.report_plot import plot_report
from pipeline.core.report_text import render_text, truncation_line

__all__ = [
    "MEGABATCH_MULT",
    "POLICY_LABELS",
    "policy_label",
    "PolicyScore",
    "AutoResult",
    "fixed_batch_size",
    "sorted_order",
    "random_order",
    "megabatch_order",
    "order_score",
    "plan_score",
    "compare_policies",
    "auto_search",
    "bucket_rows",
    "build_report",
    "render_text",
    "truncation_line",
    "plot_report",
]

# transformers.trainer_pt_utils.get_length_grouped_indices: megabatch_mult defaults to
# min(len(lengths) // (batch_size * 4), 50), at least 1.
MEGABATCH_MULT = 50
# RNG stream tags for the non-bucketed policies, so they never share a stream with a plan's
# (seed, epoch, bucket) or (seed, epoch, INTERLEAVE_STREAM) generators.
_RANDOM_STREAM, _MEGABATCH_STREAM = 0x52414E44, 0x4D454741
DEFAULT_COMPARE_KS = (6, 16, 32, 64)
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
    return np.random.default_rng((seed, _RANDOM_STREAM)).permutation(np.asarray(lengths).size)


def megabatch_order(
    lengths: np.ndarray,
    batch_size: int,
    seed: int = 0,
    *,
    mult: int | None = None,
    longest_first: bool = True,
) -> np.ndarray:
    """HF `group_by_length` order: a random permutation cut into windows of `mult` batches, each
    window sorted by length descending (stable, like Python's `sorted(..., reverse=True)`).

    `mult` defaults to HF's min(n // (4 * batch_size), 50), at least 1. With `longest_first`, HF
    swaps the head of the window holding the longest sample with the head of window 0, so an OOM
    shows at the first step. Batches here are global batches (split over ranks afterwards),
    which is exact for one rank and HF's per-process view scaled up for several.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.size
    if mult is None:
        mult = max(1, min(n // (batch_size * 4), MEGABATCH_MULT))
    window = mult * batch_size
    perm = np.random.default_rng((seed, _MEGABATCH_STREAM)).permutation(n)
    order = perm[np.lexsort((-lengths[perm], np.arange(n) // window))]
    if longest_first and n:
        heads = np.arange(0, n, window)
        j = heads[int(np.argmax(lengths[order[heads]]))]
        order[[0, j]] = order[[j, 0]]
    return order


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
    cap = plan.edges[1:][plan.micro_batch_buckets()]
    padded = micro_batch_padded(lens, offsets, multiple=plan.pad_to_multiple_of, cap=cap).sum()
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
    per rank (`pipeline.core.peers.hf_length_grouped`, held to the real samplers by a test).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    B = fixed_batch_size(lengths, batching)
    kw = dict(world_size=world_size, multiple=batching.pad_to_multiple_of)
    # The epoch number perturbs the non-bucketed permutations too, like a per-epoch reshuffle.
    s = (seed, epoch)
    if batching.mode == "token_budget" and batching.fill == "greedy":
        top = [0, int(lengths.max())]
        base = dict(batching=batching, world_size=world_size, seed=seed, epoch=epoch)
        scores = [
            plan_score(p, epoch_plan(lengths, top, **base, plan=PlanConfig(policy=p)))
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
            seed=seed,
            epoch=epoch,
            plan=plan,
        )
        scores.append(plan_score(name, p))
    return scores


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
    """The K that `buckets.num_buckets: auto` gives training, with the efficiencies behind it.

    The choice itself is `pipeline.core.epochs.auto_edges` (one `optimize_all` run, then a doubling
    and bisection search over K, each candidate scored on a real epoch-0 plan), so the report
    shows exactly what a run would use. Efficiency is only near-monotone in K, so the result
    also carries the efficiency at K - 1: a value at or above the target there would expose a
    wiggle the search stepped over.
    """
    plan_cfg = (plan or PlanConfig()).model_copy(update={"seed": seed})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a missed target is reported in the result instead
        edges = auto_edges(lengths, batching, plan_cfg, target, max_k, world_size, max_floor)
    k = len(edges) - 1
    eff = simulated_efficiency(lengths, edges, batching, plan_cfg, world_size)
    below = None
    if k > 1:
        table = table if table is not None and max(table.edges) >= k else optimize_all(lengths, k)
        below = simulated_efficiency(lengths, table.for_k(k - 1), batching, plan_cfg, world_size)
    return AutoResult(k, edges, eff, target, eff >= target, below)


def bucket_rows(plan: EpochPlan, batching: Batching) -> list[dict]:
    """Per bucket: edges, samples, tokens, steps, global and per-rank batch size, and the padding
    cost of padding every sample to the upper edge."""
    s = plan.summary()
    edges = plan.edges.tolist()
    g = global_batch_sizes(edges, batching)
    if batching.mode == "token_budget" and batching.fill == "greedy":  # per batch: the mean
        n, st = np.asarray(s["samples_per_bucket"]), np.asarray(s["steps_per_bucket"])
        g = np.round(n / np.maximum(st, 1)).astype(np.int64)
    rows = []
    for k in range(plan.num_buckets):
        n, tok, upper = s["samples_per_bucket"][k], s["tokens_per_bucket"][k], edges[k + 1]
        rows.append(
            {
                "bucket": k,
                "lower": edges[k],
                "upper": upper,
                "samples": n,
                "tokens": tok,
                "steps": s["steps_per_bucket"][k],
                "global_batch": int(g[k]),
                "micro_batch": int(-(-g[k] // plan.world_size)),
                "padded_to_upper": n * upper,
                "upper_efficiency": tok / (n * upper) if n else 1.0,
            }
        )
    return rows


def _length_stats(lengths: np.ndarray) -> dict:
    q = np.percentile(lengths, [50, 90, 99])
    return {
        "samples": int(lengths.size),
        "tokens": int(lengths.sum()),
        "min": int(lengths.min()),
        "mean": float(lengths.mean()),
        "p50": float(q[0]),
        "p90": float(q[1]),
        "p99": float(q[2]),
        "max": int(lengths.max()),
    }


def _timed(log: Callable[[str], None], what: str, fn: Callable):
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    log(f"{what}: {dt:.3f}s")
    return out, dt


def _choose_edges(
    lengths: np.ndarray,
    edges: Sequence[int] | None,
    num_buckets: int | str,
    *,
    batching: Batching,
    target: float,
    max_k: int,
    world_size: int,
    seed: int,
    plan: PlanConfig | None,
    compare_ks: Sequence[int],
    max_floor: float | None,
    timings: dict[str, float],
    log: Callable[[str], None],
) -> tuple[dict, EdgeTable, list[int]]:
    """The chosen edges (given, optimal for K, or auto), the optimiser's table and the Ks to
    compare; records the optimiser's and the auto search's times in `timings`."""
    ks = sorted(
        {k for k in compare_ks if k <= max_k}
        | ({num_buckets} if isinstance(num_buckets, int) else set())
    )
    need_k = max(ks + ([max_k] if num_buckets == "auto" else []), default=1)
    table, timings["optimize_all_s"] = _timed(
        log,
        f"optimize_all(max_k={need_k}) on {lengths.size:,} samples",
        lambda: optimize_all(lengths, need_k),
    )
    if edges is not None:
        chosen = {"name": "edges:given", "source": "given", "edges": [int(e) for e in edges]}
    elif num_buckets == "auto":
        res, timings["auto_search_s"] = _timed(
            log,
            f"auto search (target {target})",
            lambda: auto_search(
                lengths,
                batching,
                target=target,
                max_k=max_k,
                world_size=world_size,
                seed=seed,
                plan=plan,
                table=table,
                max_floor=max_floor,
            ),
        )
        chosen = {
            "name": f"optimal:{res.k}",
            "source": "auto",
            "edges": res.edges,
            "auto": asdict(res),
        }
        ks = sorted(set(ks) | {res.k})
        # The optimiser alone, for the chosen K (the auto figure above includes the plans).
        _, timings["optimize_s"] = _timed(
            log, f"optimize(K={res.k})", lambda: optimize_all(lengths, res.k)
        )
    else:
        k = int(num_buckets)
        e, timings["optimize_s"] = _timed(
            log, f"optimize(K={k})", lambda: optimize_all(lengths, k).for_k(k)
        )
        chosen = {"name": f"optimal:{k}", "source": "optimal", "edges": e}
    chosen["num_buckets"] = len(chosen["edges"]) - 1
    return chosen, table, ks


def _policy_rows(
    scores: list[PolicyScore], edge_sets: Mapping[str, list[int]], batching: Batching
) -> list[dict]:
    """The report's policy table: each score with its ratios to sorted (scores[0]) and random
    (scores[1]), its edges and its fill of the token budget."""
    sorted_eff = scores[0].efficiency
    random_eff = scores[1].efficiency
    budget = batching.token_budget if batching.mode == "token_budget" else None
    return [
        {
            "name": s.name,
            "efficiency": s.efficiency,
            "vs_sorted": s.efficiency / sorted_eff,
            # Compute per real token scales with padded tokens (ignoring attention's L^2 term).
            "speedup_vs_random": s.efficiency / random_eff,
            "real_tokens": s.real_tokens,
            "padded_tokens": s.padded_tokens,
            "micro_batches": s.micro_batches,
            "batch_size": s.batch_size,
            "edges": edge_sets.get(s.name),
            "steps": s.steps,
            "steps_vs_sorted": s.steps / max(scores[0].steps, 1),
            # Mean share of the token budget a global step pads to (token-budget mode only).
            "fill": s.padded_tokens / (s.steps * budget) if budget and s.steps else None,
            "over_budget_steps": s.over_budget,
        }
        for s in scores
    ]


def _plan_summary(the_plan: EpochPlan) -> dict:
    """The report's `plan` block: steps, samples, dropped, micro-batches and the plan hash."""
    summary = the_plan.summary()
    sizes = np.diff(the_plan.micro_offsets, axis=1)
    return {
        "steps": summary["steps"],
        "samples": summary["samples"],
        "dropped": summary["dropped"],
        "micro_batches": int(sizes.size),
        "empty_micro_batches": int((sizes == 0).sum()),
        "hash": summary["hash"],
    }


def _simulate(
    lengths: np.ndarray,
    chosen: dict,
    table: EdgeTable,
    ks: Sequence[int],
    *,
    batching: Batching,
    world_size: int,
    seed: int,
    epoch: int,
    plan: PlanConfig | None,
    timings: dict[str, float],
    log: Callable[[str], None],
) -> tuple[dict[str, list[int]], list[PolicyScore]]:
    """The edge sets to compare (team's six when every length fits, the given edges, optimal:K
    for `ks`) and every policy's score; records the simulation's time in `timings`."""
    edge_sets: dict[str, list[int]] = {}
    if lengths.max() <= TEAM_EDGES[-1]:
        edge_sets["edges:team"] = TEAM_EDGES
    if chosen["source"] == "given":
        edge_sets["edges:given"] = chosen["edges"]
    for k in ks:
        edge_sets[f"optimal:{k}"] = table.for_k(k)
    scores, timings["simulate_s"] = _timed(
        log,
        f"simulate {3 + len(edge_sets)} policies",
        lambda: compare_policies(
            lengths,
            edge_sets,
            batching=batching,
            world_size=world_size,
            seed=seed,
            epoch=epoch,
            plan=plan,
        ),
    )
    return edge_sets, scores


def _to_upper_edge(lengths: np.ndarray, edges: Sequence[int]) -> dict:
    """Padding when every sample is padded to its bucket's upper edge."""
    real = int(lengths.sum())
    padded_upper = padded_to_edges(lengths, edges)
    return {
        "real_tokens": real,
        "padded_tokens": padded_upper,
        "padding_tokens": padded_upper - real,
        "efficiency": real / padded_upper,
    }


def _frontier_rows(
    lengths: np.ndarray,
    batching: Batching,
    plan: PlanConfig | None,
    seed: int,
    world_size: int,
    frontier_ks: Sequence[int],
    timings: dict[str, float],
    log: Callable[[str], None],
) -> list[dict]:
    """Per K: efficiency, steps and recomposition floor; records its time in `timings`."""
    plan_cfg = (plan or PlanConfig()).model_copy(update={"seed": seed})
    pts, timings["frontier_s"] = _timed(
        log,
        f"frontier over {len(frontier_ks)} values of K",
        lambda: frontier(lengths, batching, plan_cfg, world_size, frontier_ks),
    )
    return [p.to_dict() for p in pts]


def build_report(
    lengths: np.ndarray,
    *,
    batching: Batching,
    edges: Sequence[int] | None = None,
    num_buckets: int | str = "auto",
    target: float = 0.97,
    max_k: int = 64,
    world_size: int = 1,
    seed: int = 0,
    epoch: int = 0,
    plan: PlanConfig | None = None,
    sample_ids: np.ndarray | None = None,
    compare_ks: Sequence[int] = DEFAULT_COMPARE_KS,
    max_floor: float | None = None,
    frontier_ks: Sequence[int] = (),
    log: Callable[[str], None] = lambda _: None,
) -> tuple[dict, EpochPlan]:
    """The bucket report (a JSON-ready dict) and the epoch plan of the chosen edges.

    The chosen edges are `edges` when given, else optimal for `num_buckets` (an int, or "auto"
    for `auto_search`). The policy table always holds sorted, random, megabatch, the team's six
    edges (when every length fits under them), the chosen edges and optimal:K for `compare_ks`.
    `log` receives progress and timing lines (the CLI prints them on stderr).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    timings: dict[str, float] = {}
    # The arguments every stage shares; each stage records its time in `timings`.
    common = {
        "batching": batching,
        "world_size": world_size,
        "seed": seed,
        "plan": plan,
        "timings": timings,
        "log": log,
    }
    chosen, table, ks = _choose_edges(
        lengths,
        edges,
        num_buckets,
        target=target,
        max_k=max_k,
        compare_ks=compare_ks,
        max_floor=max_floor,
        **common,
    )

    the_plan, timings["plan_s"] = _timed(
        log,
        f"epoch_plan({chosen['name']}, world_size={world_size})",
        lambda: epoch_plan(
            lengths,
            chosen["edges"],
            batching=batching,
            world_size=world_size,
            seed=seed,
            epoch=epoch,
            plan=plan,
            sample_ids=sample_ids,
        ),
    )

    edge_sets, scores = _simulate(lengths, chosen, table, ks, epoch=epoch, **common)
    report = {
        "lengths": _length_stats(lengths),
        "batching": {
            **batching.model_dump(),
            "non_bucketed_batch_size": fixed_batch_size(lengths, batching),
        },
        "world_size": world_size,
        "seed": seed,
        "epoch": epoch,
        "chosen": chosen,
        "buckets": bucket_rows(the_plan, batching),
        "policies": _policy_rows(scores, edge_sets, batching),
        "to_upper_edge": _to_upper_edge(lengths, chosen["edges"]),
        "plan": _plan_summary(the_plan),
        "timings": timings,
    }
    if frontier_ks:  # per K: efficiency, steps and recomposition floor (--frontier-png)
        report["frontier"] = _frontier_rows(
            lengths, batching, plan, seed, world_size, frontier_ks, timings, log
        )
    return report, the_plan
