"""Padded against packed batches on paper: token efficiency, rank balance, useful / paid work.

Pure numpy on the preset's lengths. Every policy plans epoch 0 (and epoch 1, for the pair-repeat
rate) and is scored under the cost model of `pipeline.core.packing` (a document of L tokens is
worth L + L**2 / attention_width; the default width is 6 x 2048, a 1B-class decoder):

- padded (sorted-static, random, bucketed on the auto edges), greedy to `budget` tokens per
  global step: a micro-batch of B samples padded to P costs B * (P + P**2 / width);
- packed, best-fit into rows of `row_tokens`, `rows_per_step` rows per step: a row costs
  row_tokens + sum(L**2) / width. "unbalanced" deals rows to ranks in their packing order (a
  balancing window of one step), "balanced" sorts rows by cost within windows of `balance_rows`.

Columns: token efficiency = real / paid-for tokens; max / mean rank cost = the slowest rank's
cost over the mean rank's, summed over steps; useful / paid = useful work over what the slowest
rank of every step makes all ranks pay (world size x the step's max rank cost). Pair repeat: of
the sample pairs that share a global step in epoch 0, the fraction (estimated from `pairs`
random pairs) that share one again in epoch 1, against its chance floor (the probability that
two random samples share a step of epoch 1's step sizes).

Part of `python -m bench.packed` (its JSON's `paper`).
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.core.config import DEFAULT_TOKEN_BUDGET, PlanConfig, TokenBudgetBatching
from pipeline.core.epochs import auto_edges
from pipeline.core.orders import PAIR_REPEAT_STREAM
from pipeline.core.packing import PackingSpec, doc_cost, pack_epoch, rank_costs
from pipeline.core.plan import epoch_plan
from pipeline.core.synthetic import MAX_LEN

__all__ = ["packing_table", "pair_repeat"]


def _padded_costs(plan, width: float, multiple: int) -> tuple[np.ndarray, int]:
    """([S, W] cost of each rank's padded micro-batch, padded tokens) of a padded plan."""
    mo = plan.micro_offsets
    sizes = np.diff(mo, axis=1).ravel()
    starts = mo[:, :-1].ravel()
    nz = sizes > 0
    P = np.zeros(sizes.size, dtype=np.int64)
    if plan.num_samples:
        P[nz] = np.maximum.reduceat(plan.lengths, starts[nz])
    P = -(-P // multiple) * multiple
    cost = sizes * (P + P.astype(np.float64) ** 2 / width)
    return cost.reshape(mo.shape[0], -1), int((sizes * P).sum())


def _score(costs: np.ndarray, useful: float, real: int, paid_tokens: int) -> dict:
    step_max = costs.max(axis=1)
    return {
        "token_efficiency": real / max(paid_tokens, 1),
        "max_over_mean": float(step_max.sum() / costs.mean(axis=1).sum()),
        "useful_over_paid": useful / float(step_max.sum() * costs.shape[1]),
        "steps": int(costs.shape[0]),
    }


def pair_repeat(step_a: np.ndarray, step_b: np.ndarray, pairs: int, seed: int = 0) -> dict:
    """Pairs sharing a step under `step_a` (step of each sample) that share one under `step_b`:
    the estimated rate from `pairs` uniformly drawn pairs, and the chance floor."""
    n = step_a.size
    order = np.argsort(step_a, kind="stable")
    size_a = np.bincount(step_a)
    start_a = np.concatenate([[0], np.cumsum(size_a)[:-1]])
    w = size_a * (size_a - 1) / 2.0
    rng = np.random.default_rng((seed, PAIR_REPEAT_STREAM))
    g = rng.choice(size_a.size, size=pairs, p=w / w.sum())
    i = rng.integers(0, size_a[g])
    j = (i + rng.integers(1, size_a[g])) % size_a[g]  # a distinct second member
    a, b = order[start_a[g] + i], order[start_a[g] + j]
    size_b = np.bincount(step_b).astype(np.float64)
    return {
        "rate": float((step_b[a] == step_b[b]).mean()),
        "chance": float((size_b * (size_b - 1)).sum() / (n * (n - 1.0))),
    }


def _step_of(plan, n: int) -> np.ndarray:
    """Global step of every sample (by sample id) of a padded or packed plan."""
    per_step = np.diff(plan.step_offsets)
    out = np.empty(n, dtype=np.int64)
    out[plan.sample_ids] = np.repeat(np.arange(per_step.size), per_step)
    return out


def packing_table(
    lengths: np.ndarray,
    *,
    world_sizes=(1, 8),
    budget: int = DEFAULT_TOKEN_BUDGET,
    row_tokens: int = 8192,
    rows_per_step: int = 8,
    open_rows: int = 16,
    balance_rows: int = 512,
    width: int = 6 * 2048,
    auto_target: float = 0.97,
    pairs: int = 2_000_000,
    seed: int = 0,
) -> dict:
    """Every policy at every world size (module docstring), and the seconds to pack one epoch."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n, real = lengths.size, int(lengths.sum())
    useful = float(doc_cost(lengths, width).sum())
    top = [0, int(max(MAX_LEN, lengths.max()))]
    batching = TokenBudgetBatching(token_budget=budget)
    auto = auto_edges(lengths, batching, PlanConfig(seed=seed), auto_target, 64, 1)
    padded = {
        "padded: random": (top, PlanConfig(policy="random", seed=seed)),
        "padded: sorted-static": (top, PlanConfig(policy="sorted", seed=seed)),
        f"padded: bucketed, auto edges (K={len(auto) - 1})": (auto, PlanConfig(seed=seed)),
    }
    spec = PackingSpec(
        row_tokens=row_tokens,
        rows_per_step=rows_per_step,
        attention_width=width,
        open_rows=open_rows,
        balance_rows=balance_rows,
    )
    unbalanced = PackingSpec(**{**spec.__dict__, "balance_rows": rows_per_step})
    packed = {
        "packed: full shuffle, rows in packing order": (top, unbalanced),
        "packed: full shuffle, balanced": (top, spec),
        f"packed: bucketed (auto edges, K={len(auto) - 1}), balanced": (auto, spec),
    }
    rows = []
    for name, (edges, cfg) in padded.items():

        def plan(epoch, w, edges=edges, cfg=cfg):
            return epoch_plan(
                lengths, edges, epoch=epoch, world_size=w, batching=batching, plan=cfg
            )

        rows.append(_row(name, plan, world_sizes, n, real, useful, pairs, seed, width, batching))
    for name, (edges, cfg) in packed.items():

        def plan(epoch, w, edges=edges, cfg=cfg):
            return pack_epoch(lengths, edges, seed=seed, epoch=epoch, world_size=w, spec=cfg)

        rows.append(_row(name, plan, world_sizes, n, real, useful, pairs, seed, width, batching))
    times = []
    for epoch in range(3):
        t = time.perf_counter()
        pack_epoch(lengths, top, seed=seed, epoch=epoch, world_size=max(world_sizes), spec=spec)
        times.append(time.perf_counter() - t)
    return {
        "samples": n,
        "tokens": real,
        "budget": budget,
        "row_tokens": row_tokens,
        "rows_per_step": rows_per_step,
        "open_rows": open_rows,
        "balance_rows": balance_rows,
        "attention_width": width,
        "auto_edges": [int(e) for e in auto],
        "rows": rows,
        "pack_epoch_s": sorted(times)[1],
        "pack_epoch_s_all": times,
    }


def _row(name, plan, world_sizes, n, real, useful, pairs, seed, width, batching) -> dict:
    out = {"name": name, "by_world_size": {}}
    for w in world_sizes:
        p = plan(0, w)
        if p.packed:
            costs, paid_tokens = rank_costs(p), p.rows.num_rows * p.rows.spec.row_tokens
        else:
            costs, paid_tokens = _padded_costs(p, width, batching.pad_to_multiple_of)
        out["by_world_size"][w] = _score(costs, useful, real, paid_tokens)
    out["pair_repeat"] = pair_repeat(_step_of(plan(0, 1), n), _step_of(plan(1, 1), n), pairs, seed)
    return out
