"""Cutting a bucket's shuffled samples into global batches: greedy fill to the token budget.

`batching.fill: greedy` (the default under a token budget) walks each bucket's samples in their
epoch-seeded order and closes a global batch just before the sample that would push
`batch size x padded max length` over `batching.token_budget`. The padded length is the batch
max rounded up to `pad_to_multiple_of`, never beyond the bucket's upper edge (what the collator
pads to: `collate.padded_length`), so the budget is a hard cap on every global step.
`fill: fixed_per_bucket` keeps the older rule (every batch of bucket k has `token_budget //
upper_k` samples, rounded down to `round_to`), so plans made with it keep their hashes.

Rank shares. Global batches never depend on the world size (contract 8); a global batch of n
samples and padded length L (n * L <= budget) is split with np.array_split, so rank r gets m_r in
{floor(n/W), ceil(n/W)} samples and pads them to its own max, at most L. A rank's share of the
step's budget is defined as the share of the samples it holds, budget * m_r / n, and its
micro-batch never exceeds it: m_r * L_r <= m_r * L <= budget * m_r / n. In absolute terms a
micro-batch is at most ceil(n/W) * L <= budget / W + L, and exactly at most budget / W whenever W
divides n. A fixed `budget / W` cap for every W cannot hold for world-size-independent batches
(all samples equal to budget / 8 and W = 16 already breaks it), so the granule is the user's
choice: with `round_to: r` every greedy batch that can hold r samples has a multiple of r, which
makes `budget / W` exact for every W dividing r (e.g. r = 8 for 1, 2, 4 or 8 ranks). By default
greedy batches are not rounded (round_to null), which is what fills the budget.

The cut is vectorized: for every position i, the largest n with n * max(p[i:i+n]) <= budget is
found by binary lifting over a sparse table of range maxima (O(N log n_max) numpy work), and the
batch starts are then the chain i -> i + n(i) from each bucket's first sample, a Python walk over
batches (not samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.collate import padded_length
from pipeline.core.config import Batching, ConfigError

__all__ = [
    "Cut",
    "batches_per_bucket",
    "effective_round_to",
    "round_down_to",
    "greedy_sizes",
    "cut_global_batches",
]

_DEFAULT_ROUND_TO = {"fixed_per_bucket": 8, "greedy": 1}


@dataclass(frozen=True)
class Cut:
    """Global batches of every bucket, bucket-major: batch i covers positions
    [start[i], start[i] + size[i]) of the bucket-ordered sample array."""

    start: np.ndarray
    size: np.ndarray
    per_bucket: np.ndarray  # [K] global batches of each bucket
    dropped: int  # samples dropped by drop_remainder


def round_down_to(n: np.ndarray, r: int) -> np.ndarray:
    """Each count rounded down to a multiple of `r`, except counts below `r`, which stay: a
    batch never shrinks to nothing (the `round_to` rule of both fills)."""
    n = np.asarray(n, dtype=np.int64)
    return np.where(n >= r, n - n % r, n) if r > 1 else n


def batches_per_bucket(counts: np.ndarray, g: np.ndarray, drop_remainder: bool) -> np.ndarray:
    """Global batches of each bucket of counts[k] samples cut into batches of g[k] (the fixed
    fills): a short last batch is kept, or dropped with `drop_remainder`."""
    return counts // g if drop_remainder else -(-counts // g)


def effective_round_to(batching: Batching) -> int:
    """`batching.round_to`, or its default for the fill (null: 8 per bucket, 1 greedy)."""
    r = batching.round_to
    return _DEFAULT_ROUND_TO[batching.fill] if r is None else int(r)


def _longest_fit(p: np.ndarray, budget: int, upper: int) -> np.ndarray:
    """For every position i of one bucket's padded lengths `p` (all <= upper and <= budget):
    the largest n with n * max(p[i:i+n]) <= budget, not running past the bucket's end.

    Every start fits n0 = budget // max(p) samples, so the search starts there and lifts n by
    powers of two from a sparse table of range maxima; a sentinel block above the budget past
    the end stops any batch from leaving the bucket.
    """
    c = p.size
    assert int(p.max()) <= min(upper, budget), "padded lengths are capped at the upper edge"
    n0 = budget // int(p.max())  # every start fits this many (the edge may exceed the budget)
    room = c - np.arange(c, dtype=np.int64)
    if n0 >= c:
        return room  # the whole rest of the bucket fits from every start
    n1 = min(budget // max(int(p.min()), 1), c)
    lift = max(n1 - n0, 0).bit_length()
    top = max(n0.bit_length(), lift, 1)
    dtype = np.int32 if (2 * n1 + 2) * (budget + 1) < 2**31 else np.int64
    ext = np.concatenate([p, np.full(1 << top, budget + 1)]).astype(dtype)
    table = [ext]  # table[j][x] = max(ext[x : x + 2**j]) (truncated at the array end)
    for j in range(1, top):
        prev, h = table[-1], 1 << (j - 1)
        cur = prev.copy()
        cur[:-h] = np.maximum(prev[:-h], prev[h:])
        table.append(cur)
    i = np.arange(c)
    j0 = n0.bit_length() - 1
    best = np.maximum(table[j0][i], table[j0][i + n0 - (1 << j0)])  # max(p[i : i + n0])
    n = np.full(c, n0, dtype=dtype)
    for j in reversed(range(lift)):
        cand = n + (1 << j)
        m = np.maximum(best, table[j][i + n])
        ok = cand * m <= budget
        n[ok] = cand[ok]
        best[ok] = m[ok]
    return np.where(best > budget, room, n).astype(np.int64)  # the tail: all that is left


def greedy_sizes(
    padded: np.ndarray, counts: np.ndarray, uppers: np.ndarray, budget: int, round_to: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """(starts, sizes) of the greedy global batches of consecutive segments of `padded`.

    Segment k is the next counts[k] entries, none above uppers[k]; each is cut from its first sample on, every batch as
    long as `size x max padded length <= budget` allows, then rounded down to a multiple of
    `round_to` when it holds at least `round_to` samples. Batches never straddle segments.
    """
    padded = np.asarray(padded, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    N = padded.size
    if N == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if int(padded.max()) > budget:
        raise ConfigError(
            f"batching.token_budget={budget} is below the padded length {int(padded.max())} of the "
            f"longest sample: raise token_budget to at least {int(padded.max())}"
        )
    n = np.empty(N, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    for k in np.flatnonzero(counts):
        seg = padded[bounds[k] : bounds[k + 1]]
        n[bounds[k] : bounds[k + 1]] = _longest_fit(seg, budget, int(uppers[k]))
    n = round_down_to(n, round_to)
    nxt = (np.arange(N) + n).tolist()
    starts, s = [], 0
    while s < N:
        starts.append(s)
        s = nxt[s]
    starts = np.asarray(starts, dtype=np.int64)
    return starts, n[starts]


def _fixed_cut(counts: np.ndarray, g: np.ndarray, drop_remainder: bool) -> Cut:
    nb = batches_per_bucket(counts, g, drop_remainder)
    kept = np.minimum(counts, nb * g)
    bucket_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    k = np.repeat(np.arange(counts.size), nb)
    j = np.arange(int(nb.sum())) - np.repeat(np.cumsum(nb) - nb, nb)
    start = bucket_start[k] + j * g[k]
    size = np.minimum(g[k], bucket_start[k] + kept[k] - start)
    return Cut(start, size, nb.astype(np.int64), int((counts - kept).sum()))


def cut_global_batches(
    ordered_lengths: np.ndarray, counts: np.ndarray, edges, batching: Batching, g=None
) -> Cut:
    """Global batches of each bucket from its samples in epoch order (`ordered_lengths`, bucket
    after bucket, counts[k] of bucket k). `g`: the per-bucket sizes for the fixed fills."""
    counts = np.asarray(counts, dtype=np.int64)
    if batching.mode == "fixed" or batching.fill == "fixed_per_bucket":
        return _fixed_cut(counts, np.asarray(g, dtype=np.int64), batching.drop_remainder)
    upper = np.repeat(np.asarray(edges, dtype=np.int64)[1:], counts)
    p = padded_length(ordered_lengths, upper, batching.pad_to_multiple_of)
    uppers = np.asarray(edges, dtype=np.int64)[1:]
    starts, sizes = greedy_sizes(
        p, counts, uppers, batching.token_budget, effective_round_to(batching)
    )
    bucket = np.searchsorted(np.cumsum(counts), starts, side="right")
    dropped = 0
    if batching.drop_remainder and starts.size:
        # A bucket's last batch is partial when one more sample of its padded length still fits.
        last = np.flatnonzero(np.r_[bucket[1:] != bucket[:-1], True])
        lmax = np.maximum.reduceat(p, starts)[last]
        partial = (sizes[last] + 1) * lmax <= batching.token_budget
        drop = last[partial]
        dropped = int(sizes[drop].sum())
        keep = np.ones(starts.size, dtype=bool)
        keep[drop] = False
        starts, sizes, bucket = starts[keep], sizes[keep], bucket[keep]
    per_bucket = np.bincount(bucket, minlength=counts.size).astype(np.int64)
    return Cut(starts, sizes, per_bucket, dropped)
