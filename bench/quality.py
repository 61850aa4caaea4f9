"""Benchmark section 3: training-signal quality, from plans and from a run's logged metrics.

Batch recomposition compares the micro-batches of epochs 0 and 1 of the same planner the
training loop uses. With batches of B samples drawn from a pool of n, a fresh shuffle still
re-pairs some samples by chance: a batch holds B(B-1)/2 pairs and each pair shared an epoch-0
batch with probability ~(B-1)/(n-1), so the expected share of batches with a repeated pair is
1 - exp(-B(B-1)/2 * (B-1)/(n-1)); `pipeline.core.frontier.recomposition_floor` gives that floor for
a plan's own batch and bucket sizes, so a measured share can be read against what chance alone
allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pipeline.core.config import Batching, BatchingConfig, PlanConfig
from pipeline.core.frontier import recomposition_floor
from pipeline.core.metrics import (
    BucketLossTracker,
    batch_recomposition,
    readability_ratio,
    switch_rate,
)
from pipeline.core.plan import EpochPlan, epoch_plan
from pipeline.report.peers import megabatch_order

__all__ = [
    "repeated_pair_share",
    "recomposition_table",
    "recomposition_section",
    "loss_readability",
]


def repeated_pair_share(
    ids_a: np.ndarray, offsets_a: np.ndarray, ids_b: np.ndarray, offsets_b: np.ndarray
) -> float:
    """Share of all sample pairs sharing a micro-batch in epoch b that also shared one in epoch a
    (sorted-static: 1.0; a fresh shuffle of pools of n: ~(B-1)/(n-1)). The pair-level companion
    of `metrics.batch_recomposition`, which flags a whole batch for a single repeated pair."""
    ids_a, ids_b = np.asarray(ids_a, dtype=np.int64), np.asarray(ids_b, dtype=np.int64)
    mb_a = np.repeat(np.arange(np.size(offsets_a) - 1), np.diff(offsets_a))
    prev = np.full(int(max(ids_a.max(initial=0), ids_b.max(initial=0))) + 1, -1, dtype=np.int64)
    prev[ids_a] = mb_a
    mb_b = np.repeat(np.arange(np.size(offsets_b) - 1), np.diff(offsets_b))
    p = prev[ids_b]
    seen = p >= 0
    # Samples of one epoch-b batch that came from the same epoch-a batch: c of them form c(c-1)/2
    # repeated pairs.
    _, c = np.unique(mb_b[seen] * (mb_a.size + 1) + p[seen], return_counts=True)
    sizes = np.diff(offsets_b).astype(np.float64)
    total = float((sizes * (sizes - 1) / 2).sum())
    return float((c * (c - 1) / 2).sum() / total) if total else 0.0


def _plan(lengths, edges, batching, policy: str, epoch: int, seed: int) -> EpochPlan:
    return epoch_plan(
        lengths,
        edges,
        epoch=epoch,
        world_size=1,
        batching=batching,
        plan=PlanConfig(policy=policy, seed=seed),
    )


def _megabatch_recomposition(lengths: np.ndarray, batch_size: int, seed: int) -> dict:
    """HF group_by_length: epoch e's order reshuffled with (seed, e), cut into fixed batches."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.size
    offsets = np.append(np.arange(0, n, batch_size), n)  # fixed batches, the last one partial
    a = megabatch_order(lengths, batch_size, (seed, 0))
    b = megabatch_order(lengths, batch_size, (seed, 1))
    return {
        "recomposition": batch_recomposition(a, offsets, b, offsets),
        "repeated_pairs": repeated_pair_share(a, offsets, b, offsets),
    }


def recomposition_table(
    lengths: np.ndarray,
    edge_sets: Mapping[str, Sequence[int]],
    batching: Batching,
    *,
    seed: int = 0,
) -> list[dict]:
    """Per policy: recomposition between epochs 0 and 1, its chance floor, and the bucket switch
    rate of epoch 1 (observed and expected under independent draws).

    `edge_sets` names the bucketed policies; sorted-static, random and megabatch come first.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    top = [0, int(lengths.max())]
    rows = []
    policies = [("sorted", "sorted", top), ("random", "random", top)]
    policies += [(name, "bucketed", edges) for name, edges in edge_sets.items()]
    for name, policy, edges in policies:
        p0, p1 = (_plan(lengths, edges, batching, policy, e, seed) for e in (0, 1))
        _, off0 = p0.micro_batch_lengths()
        _, off1 = p1.micro_batch_lengths()
        observed, expected_switch = switch_rate(p1.step_bucket)
        rows.append(
            {
                "name": name,
                "recomposition": batch_recomposition(p0.sample_ids, off0, p1.sample_ids, off1),
                "repeated_pairs": repeated_pair_share(p0.sample_ids, off0, p1.sample_ids, off1),
                # sorted-static repeats its batches by construction: no chance floor applies.
                "chance_floor": None if policy == "sorted" else recomposition_floor(p1),
                "num_buckets": p1.num_buckets,
                "steps": p1.num_steps,
                "mean_batch": float(p1.num_samples / max(p1.num_steps, 1)),
                "switch_rate": observed if p1.num_buckets > 1 else None,
                "switch_rate_expected": expected_switch if p1.num_buckets > 1 else None,
            }
        )
    if batching.mode == "fixed":
        # Megabatch is not a planner policy; rebuild its fixed-size batches from two epochs' orders.
        B = batching.batch_size
        mb = {
            "name": "megabatch",
            **_megabatch_recomposition(lengths, B, seed),
            "chance_floor": None,
            "num_buckets": None,
            "steps": -(-lengths.size // B),
            "mean_batch": float(B),
            "switch_rate": None,
            "switch_rate_expected": None,
        }
        rows.insert(2, mb)
    return rows


def recomposition_section(lengths: np.ndarray, batchings: dict) -> dict:
    """Recomposition and switch rate of the team's edges, optimal K=32 and auto, under each
    batching of a `padding.padding_table` (its `batchings` block)."""
    out: dict = {"samples": int(np.asarray(lengths).size), "recomposition": {}}
    for name, block in batchings.items():
        edge_sets = {
            p["name"]: p["edges"]
            for p in block["policies"]
            if p["edges"] is not None and p["name"] in ("edges:team", "optimal:32", "optimal:auto")
        }
        b = BatchingConfig(**block["batching"])
        rows = recomposition_table(lengths, edge_sets, b)
        label = (
            f"micro-batch {b.batch_size}"
            if b.mode == "fixed"
            else f"token budget {b.token_budget:,}"
        )
        out["recomposition"][name] = {"label": label, "auto_k": block["auto"]["k"], "rows": rows}
    return out


def loss_readability(curves: dict, skip: int = 0) -> dict:
    """Step-to-step variance of the raw and the bucket-debiased loss over the same steps.

    Variance of first differences: a slow trend barely contributes, the jumps a bucket change
    causes do. `skip` leaves out the first steps, before every bucket's running loss exists.
    """
    raw = np.array([v for _, v in curves["loss"]], dtype=np.float64)[skip:]
    deb = np.array([v for _, v in curves["loss_debiased"]], dtype=np.float64)[skip:]
    var_raw, var_deb, ratio = readability_ratio(raw, deb)
    buckets = np.asarray(curves.get("bucket", []))
    return {
        "steps": int(raw.size),
        "skipped": skip,
        "buckets_seen": int(np.unique(buckets).size),
        "visits_per_bucket": float(buckets.size / max(np.unique(buckets).size, 1)),
        "tracker_window": BucketLossTracker(1).window,
        "tracker_ridge": BucketLossTracker(1).ridge,
        "diff_var_raw": var_raw,
        "diff_var_debiased": var_deb,
        "ratio": ratio,
    }
