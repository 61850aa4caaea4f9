"""Bucket edges: exact minimum-padding edges by dynamic programming over the length histogram.

Padding every sample to its bucket's upper edge costs `upper * count - sum(lengths)` per bucket.
Choosing K edges to minimise the total is a 1-D K-partition of the sorted distinct lengths with a
Monge cost, so the best split point is monotone in the right end and each DP layer is solved by
divide and conquer; here every recursion level of that divide and conquer runs as one vectorized
numpy pass, giving O(K * U log U) work with only K * log U Python iterations (U <= 8192 distinct
lengths).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.config import ConfigError, parse_edges

__all__ = ["EdgeTable", "optimize", "optimize_all", "assign", "padded_to_edges", "validate_edges"]


@dataclass(frozen=True)
class EdgeTable:
    """Optimal edges for every K in 1..max_k, from one DP run."""

    edges: dict[int, list[int]]
    cost: dict[int, int]  # padded-minus-real tokens under to-upper-edge padding

    def for_k(self, k: int) -> list[int]:
        # With fewer distinct lengths than k, the optimum is one bucket per distinct length.
        return self.edges[min(k, max(self.edges))]


def _histogram(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.asarray(lengths)
    if lengths.size == 0:
        raise ValueError("cannot optimise bucket edges for an empty dataset")
    if lengths.min() < 1:
        raise ValueError(f"lengths must be >= 1, got min {lengths.min()}")
    values, counts = np.unique(lengths.astype(np.int64), return_counts=True)
    return values, counts.astype(np.int64)


def _layer(prev: np.ndarray, v: np.ndarray, C: np.ndarray, S: np.ndarray, k: int):
    """One DP layer: best[j] = min_i prev[i-1] + cost(i, j) over i in [k-1, j], for j >= k-1.

    `prev[i-1]` is the optimum for covering distinct values 0..i-1 with k-1 buckets (prev_shift
    below holds it at index i). Returns (best, argmin) with inf / -1 where infeasible.
    """
    U = v.size
    if k == 1:
        return v * C[1:] - S[1:], np.zeros(U, dtype=np.int64)
    INF = np.iinfo(np.int64).max // 4
    prev_shift = np.full(U, INF, dtype=np.int64)  # prev_shift[i] = prev[i-1]
    prev_shift[1:] = prev[:-1]
    best = np.full(U, INF, dtype=np.int64)
    arg = np.full(U, -1, dtype=np.int64)
    # Pending segments: right ends j in [jlo, jhi], split candidates i in [ilo, ihi].
    jlo = np.array([k - 1], dtype=np.int64)
    jhi = np.array([U - 1], dtype=np.int64)
    ilo = np.array([k - 1], dtype=np.int64)
    ihi = np.array([U - 1], dtype=np.int64)
    while jlo.size:
        mid = (jlo + jhi) // 2
        hi = np.minimum(mid, ihi)
        n = hi - ilo + 1  # >= 1 because ilo <= mid always holds
        seg = np.repeat(np.arange(mid.size), n)
        starts = np.cumsum(n) - n
        i = ilo[seg] + (np.arange(seg.size) - starts[seg])
        j = mid[seg]
        val = prev_shift[i] + v[j] * (C[j + 1] - C[i]) - (S[j + 1] - S[i])
        # Segment-wise argmin, ties to the smallest i (keeps the split monotone).
        order = np.lexsort((i, val, seg))
        first = order[starts]
        best[mid] = val[first]
        arg[mid] = i[first]
        opt = i[first]
        left = mid - 1 >= jlo
        right = mid + 1 <= jhi
        jlo, jhi, ilo, ihi = (
            np.concatenate([jlo[left], mid[right] + 1]),
            np.concatenate([mid[left] - 1, jhi[right]]),
            np.concatenate([ilo[left], opt[right]]),
            np.concatenate([opt[left], ihi[right]]),
        )
    return best, arg


def optimize_all(lengths: np.ndarray, max_k: int) -> EdgeTable:
    """Exact minimum-padding edges for every K in 1..max_k (K capped at the distinct lengths)."""
    if not 1 <= max_k <= 64:
        raise ValueError(f"num_buckets must be in 1..64, got {max_k}")
    v, c = _histogram(lengths)
    U = v.size
    C = np.concatenate([[0], np.cumsum(c)])
    S = np.concatenate([[0], np.cumsum(c * v)])
    kmax = min(max_k, U)
    prev = np.zeros(U, dtype=np.int64)
    args = []
    costs = {}
    for k in range(1, kmax + 1):
        prev, arg = _layer(prev, v, C, S, k)
        args.append(arg)
        costs[k] = int(prev[U - 1])
    edges = {}
    for k in range(1, kmax + 1):
        uppers = []
        j = U - 1
        for layer in range(k, 0, -1):
            uppers.append(int(v[j]))
            j = int(args[layer - 1][j]) - 1
        edges[k] = [0] + uppers[::-1]
    return EdgeTable(edges=edges, cost=costs)


def optimize(lengths: np.ndarray, num_buckets: int) -> list[int]:
    """Edges [0, e1, ..., max(lengths)] minimising total padded tokens with `num_buckets` buckets."""
    return optimize_all(lengths, num_buckets).for_k(num_buckets)


def validate_edges(edges, lengths: np.ndarray | None = None) -> np.ndarray:
    """Check user edges (and, given lengths, that each sample fits under the top edge)."""
    e = np.asarray(parse_edges(edges), dtype=np.int64)
    if lengths is not None:
        over = np.flatnonzero(np.asarray(lengths) > e[-1])
        if over.size:
            raise ConfigError(
                f"{over.size} samples are longer than the top bucket edge {e[-1]} "
                f"(first sample ids: {over[:10].tolist()}); raise the top edge or set "
                "data.over_length=truncate"
            )
    return e


def assign(lengths: np.ndarray, edges) -> np.ndarray:
    """Bucket index per sample: bucket k holds lengths in (edges[k], edges[k+1]]."""
    e = np.asarray(edges, dtype=np.int64)
    b = np.searchsorted(e, np.asarray(lengths), side="left") - 1
    bad = (b < 0) | (b >= e.size - 1)
    if bad.any():
        idx = np.flatnonzero(bad)
        raise ValueError(
            f"{idx.size} lengths fall outside edges {e.tolist()} (positions {idx[:10].tolist()})"
        )
    return b


def padded_to_edges(lengths: np.ndarray, edges) -> int:
    """Total padded tokens when every sample is padded to its bucket's upper edge."""
    e = np.asarray(edges, dtype=np.int64)
    return int(e[assign(lengths, e) + 1].sum())
