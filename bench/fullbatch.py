"""Full batches under a token budget, against the batchers users pick (part of `bench.padding`).

At one global token budget, every row reports the mean fill of the budget, global steps per epoch,
padding efficiency, both relative to the reference a peer would accept (sorted batches cut
greedily to the same budget, as fairseq's `batch_by_size`), and the steps whose padded slots
exceed the budget. Rows: that reference; lhotse-style dynamic bucketing (32 equal-mass buckets,
`max_duration` = budget, its default sum rule and its strict variant); HF `group_by_length`
(fixed batch budget // longest, the simulation of `pipeline.report.peers`); bucketray at K=32 and
auto, before (`fill: fixed_per_bucket`) and after (`fill: greedy`). Plus the HF samplers' fidelity
(simulated vs the real transformers samplers, when installed) and the planning time of one epoch.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from bench.common import median_time
from pipeline.core.buckets import optimize_all
from pipeline.core.config import DEFAULT_TOKEN_BUDGET, BatchingConfig, PlanConfig
from pipeline.core.epochs import auto_edges
from pipeline.core.metrics import micro_batch_padded
from pipeline.core.plan import EpochPlan, epoch_plan
from pipeline.report.peers import hf_length_grouped, lhotse_style

__all__ = ["budget_table", "hf_fidelity"]


def _row(name: str, lens: np.ndarray, offsets: np.ndarray, world: int, budget: int, cap=None):
    """Fill, steps, efficiency and over-budget steps of micro-batches in (step, rank) order."""
    mb = micro_batch_padded(lens, offsets, multiple=8, cap=cap)
    step = mb.reshape(-1, world).sum(axis=1)
    share = mb.reshape(-1, world).max(axis=1)
    return {
        "name": name,
        "steps": int(step.size),
        "fill": float(step.sum() / (budget * step.size)),
        "efficiency": float(lens.sum() / mb.sum()),
        "over_budget_steps": int((step > budget).sum()),
        "max_step_over_budget": float(step.max() / budget),
        "max_micro_over_share": float(share.max() * world / budget),
    }


def _plan_row(name: str, plan: EpochPlan, budget: int) -> dict:
    lens, offsets = plan.micro_batch_lengths()
    return _row(name, lens, offsets, plan.world_size, budget, plan.micro_batch_caps())


def _order_row(name, lengths, order, sizes, world, budget):
    g = np.asarray(sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(g)])
    r = np.arange(world + 1)[None, :]
    mo = starts[:-1, None] + r * (g[:, None] // world) + np.minimum(r, g[:, None] % world)
    offsets = np.concatenate([mo[:, :-1].ravel(), starts[-1:]])
    return _row(name, lengths[order], offsets, world, budget)


def budget_table(
    lengths: np.ndarray,
    *,
    budget: int = DEFAULT_TOKEN_BUDGET,
    k: int = 32,
    world_sizes=(1, 8),
    target: float = 0.97,
    seed: int = 0,
    repeats: int = 3,
) -> dict:
    """Per world size: the rows above; relative columns are against the greedy sorted reference."""
    lengths = np.asarray(lengths, dtype=np.int64)
    top = [0, int(lengths.max())]
    greedy = BatchingConfig(token_budget=budget)
    before = BatchingConfig(token_budget=budget, fill="fixed_per_bucket")
    cfg = PlanConfig(seed=seed)
    table = optimize_all(lengths, max(k, 64))
    out: dict = {"budget": budget, "k": k, "target": target, "worlds": {}, "auto_k": {}}
    for world in world_sizes:
        auto = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for tag, bat in (("before", before), ("after", greedy)):
                auto[tag] = auto_edges(lengths, bat, cfg, target, 64, world)
        out["auto_k"][str(world)] = {t: len(e) - 1 for t, e in auto.items()}

        def plan(edges, bat, policy="bucketed", world=world):
            return epoch_plan(
                lengths,
                edges,
                epoch=0,
                world_size=world,
                batching=bat,
                plan=PlanConfig(seed=seed, policy=policy),
            )

        rows = [
            _plan_row(
                "sorted, greedy to the budget (reference)", plan(top, greedy, "sorted"), budget
            )
        ]
        for strict in (False, True):
            order, sizes = lhotse_style(lengths, budget, 32, seed, strict=strict)
            name = "lhotse-style, 32 buckets" + (" (strict)" if strict else " (sum rule)")
            rows.append(_order_row(name, lengths, order, sizes, world, budget))
        b = max(1, budget // int(lengths.max()) // world)
        ids, offsets, _ = hf_length_grouped(lengths, b, world, (seed, 0))
        rows.append(_row(f"HF group_by_length, {b}/rank", lengths[ids], offsets, world, budget))
        for tag, bat in (("before", before), ("after", greedy)):
            for kk, edges in ((k, table.for_k(k)), (len(auto[tag]) - 1, auto[tag])):
                label = f"K={kk}" if edges is not auto[tag] else f"auto (K={kk})"
                rows.append(_plan_row(f"bucketray {label}, {tag}", plan(edges, bat), budget))
        if world > 1:  # the user's granule: an exact budget / world cap per rank
            bat = BatchingConfig(token_budget=budget, round_to=world)
            rows.append(
                _plan_row(
                    f"bucketray K={k}, after, round_to={world}", plan(table.for_k(k), bat), budget
                )
            )
        ref = rows[0]
        for r in rows:
            r["steps_vs_reference"] = r["steps"] / ref["steps"]
            r["efficiency_vs_reference"] = r["efficiency"] / ref["efficiency"]
        out["worlds"][str(world)] = rows
    edges = table.for_k(k)
    times = {}
    for tag, bat in (("before", before), ("after", greedy)):
        times[tag], _, _ = median_time(
            lambda bat=bat: epoch_plan(
                lengths, edges, epoch=0, world_size=8, batching=bat, plan=cfg
            ),
            repeats,
        )
    out["plan_s"] = times
    out["epochs"] = [
        epoch_plan(lengths, edges, epoch=e, world_size=8, batching=greedy, plan=cfg).num_steps
        for e in range(3)
    ]
    return out


def hf_fidelity(
    lengths: np.ndarray, *, per_device: int = 32, world_sizes=(1, 8), rebalance_samples=100_000
) -> dict:
    """HF samplers: the simulation vs the real transformers samplers (when installed), and the
    real `BatchRebalanceSampler` (slow: pure Python per global batch, so on a prefix)."""
    from pipeline.report import hf_peers

    lengths = np.asarray(lengths, dtype=np.int64)

    def eff(lens, ids, offsets):
        x = lens[ids]
        return float(x.sum() / micro_batch_padded(x, offsets, multiple=8).sum())

    out: dict = {"per_device": per_device, "available": hf_peers.available(), "rows": []}
    for w in world_sizes:
        row = {
            "world_size": w,
            "simulated": eff(lengths, *hf_length_grouped(lengths, per_device, w)[:2]),
        }
        if out["available"]:
            t = time.perf_counter()
            row["real"] = eff(lengths, *hf_peers.length_grouped(lengths, per_device, w)[:2])
            row["real_s"] = time.perf_counter() - t
            if w > 1:
                sub = lengths[:rebalance_samples]
                r = hf_peers.batch_rebalance(sub, per_device * w, w)
                row["rebalance"] = eff(sub, *r[:2])
                row["rebalance_samples"] = int(sub.size)
        out["rows"].append(row)
    return out
