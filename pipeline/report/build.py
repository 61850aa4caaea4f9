"""The bucket report of one run config's batching on a set of sample lengths (a JSON-ready dict).

The run's edges (`pipeline.core.epochs.resolve_edges`: given, optimal for K, or `auto`), their
epoch plan, per-bucket sizes and the policy table scored by `policies`; with batching.mode=packed,
the packed epoch (`packed_report`). The text rendering is `text.render_text`, the PNG
`plot.plot_report`. Pure numpy.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import NamedTuple

import numpy as np

from pipeline.core.buckets import EdgeTable, optimize_all, padded_to_edges
from pipeline.core.config import (
    TEAM_EDGES,
    Batching,
    OptimisedBuckets,
    PackedBatching,
    RunConfig,
)
from pipeline.core.epochs import epoch_plan_for, packing_spec, resolve_edges
from pipeline.core.frontier import frontier
from pipeline.core.packing import packed_summary
from pipeline.core.plan import EpochPlan, global_batch_sizes
from pipeline.report.policies import PolicyScore, auto_details, compare_policies, fixed_batch_size

__all__ = ["bucket_rows", "build_report", "packed_report"]

MAX_BUCKETS = OptimisedBuckets.model_fields["max_buckets"].default
DEFAULT_COMPARE_KS = (6, 16, 32, 64)


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
    cfg: RunConfig,
    compare_ks: Sequence[int],
    timings: dict[str, float],
    log: Callable[[str], None],
) -> tuple[dict, EdgeTable, list[int]]:
    """The run's edges (`resolve_edges`: given, optimal for K, or auto), the optimiser's table and
    the Ks to compare; records the optimiser's and the edge choice's times in `timings`."""
    b = cfg.buckets
    asked = "given" if b.edges is not None else b.num_buckets
    max_k = b.max_buckets if b.edges is None else MAX_BUCKETS
    ks = sorted(
        {k for k in compare_ks if k <= max_k} | ({asked} if isinstance(asked, int) else set())
    )
    need_k = max(ks + ([max_k] if asked == "auto" else []), default=1)
    table, timings["optimize_all_s"] = _timed(
        log,
        f"optimize_all(max_k={need_k}) on {lengths.size:,} samples",
        lambda: optimize_all(lengths, need_k),
    )
    if asked == "given":
        edges = [int(e) for e in resolve_edges(cfg, lengths)]
        chosen = {"name": "edges:given", "source": "given", "edges": edges}
    elif asked == "auto":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a missed target is reported in the result instead
            edges, timings["auto_search_s"] = _timed(
                log,
                f"auto search (target {b.target_efficiency})",
                lambda: [int(e) for e in resolve_edges(cfg, lengths)],
            )
        res = auto_details(
            lengths,
            edges,
            cfg.batching,
            target=b.target_efficiency,
            world_size=cfg.scaling.num_workers,
            plan=cfg.plan,
            table=table,
        )
        chosen = {"name": f"optimal:{res.k}", "source": "auto", "edges": edges, "auto": asdict(res)}
        ks = sorted(set(ks) | {res.k})
        # The optimiser alone, for the chosen K (the auto figure above includes the plans).
        _, timings["optimize_s"] = _timed(
            log, f"optimize(K={res.k})", lambda: optimize_all(lengths, res.k)
        )
    else:
        edges, timings["optimize_s"] = _timed(
            log, f"optimize(K={asked})", lambda: [int(e) for e in resolve_edges(cfg, lengths)]
        )
        chosen = {"name": f"optimal:{asked}", "source": "optimal", "edges": edges}
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
    cfg: RunConfig,
    chosen: dict,
    table: EdgeTable,
    ks: Sequence[int],
    epoch: int,
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
            batching=cfg.batching,
            world_size=cfg.scaling.num_workers,
            seed=cfg.plan.seed,
            epoch=epoch,
            plan=cfg.plan,
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


class _Lengths(NamedTuple):
    """The length index `epoch_plan_for` plans from, for lengths held in memory."""

    lengths: np.ndarray
    sample_ids: np.ndarray | None


def build_report(
    lengths: np.ndarray,
    cfg: RunConfig,
    *,
    epoch: int = 0,
    sample_ids: np.ndarray | None = None,
    compare_ks: Sequence[int] = DEFAULT_COMPARE_KS,
    frontier_ks: Sequence[int] = (),
    log: Callable[[str], None] = lambda _: None,
) -> tuple[dict, EpochPlan]:
    """The bucket report of a padded run config (a JSON-ready dict) and the epoch plan of its edges.

    The edges are the run's (`pipeline.core.epochs.resolve_edges`), planned as the run plans
    them (`epoch_plan_for`, on `scaling.num_workers` ranks, seeded by `plan.seed`). The policy
    table always holds sorted, random, megabatch, the team's six edges (when every length fits
    under them), the chosen edges and optimal:K for `compare_ks`. `log` receives progress and
    timing lines (the CLI prints them on stderr).
    """
    if isinstance(cfg.batching, PackedBatching):
        raise ValueError("build_report scores padded batches: give it a padded batching section")
    lengths = np.asarray(lengths, dtype=np.int64)
    batching, world_size, seed = cfg.batching, cfg.scaling.num_workers, cfg.plan.seed
    timings: dict[str, float] = {}
    chosen, table, ks = _choose_edges(lengths, cfg, compare_ks, timings, log)
    the_plan, timings["plan_s"] = _timed(
        log,
        f"epoch_plan({chosen['name']}, world_size={world_size})",
        lambda: epoch_plan_for(
            cfg, _Lengths(lengths, sample_ids), chosen["edges"], epoch, world_size
        ),
    )
    edge_sets, scores = _simulate(lengths, cfg, chosen, table, ks, epoch, timings, log)
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
        pts, timings["frontier_s"] = _timed(
            log,
            f"frontier over {len(frontier_ks)} values of K",
            lambda: frontier(lengths, batching, cfg.plan, world_size, frontier_ks),
        )
        report["frontier"] = [p.to_dict() for p in pts]
    return report, the_plan


def packed_report(
    lengths: np.ndarray,
    cfg: RunConfig,
    *,
    epoch: int = 0,
    sample_ids: np.ndarray | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> tuple[dict, EpochPlan]:
    """The packed epoch of a `batching.mode=packed` run config, as the run packs it (its edges
    from `resolve_edges`: `auto` is one bucket, a full shuffle; `epoch_plan_for` with the run's
    `packing_spec`), and its summary (`pipeline.core.packing.packed_summary`)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    edges = [int(e) for e in resolve_edges(cfg, lengths)]
    t = time.perf_counter()
    plan = epoch_plan_for(cfg, _Lengths(lengths, sample_ids), edges, epoch, cfg.scaling.num_workers)
    seconds = time.perf_counter() - t
    log(f"packed epoch {epoch} in {seconds:.2f}s")
    summary = {
        **packed_summary(plan),
        "edges": edges,
        "attention_width": packing_spec(cfg).attention_width,
        "pack_seconds": seconds,
    }
    return summary, plan
