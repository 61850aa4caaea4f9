"""The batchers users choose between, simulated in numpy on the same lengths as bucketray's plan.

- `hf_length_grouped`: Hugging Face `group_by_length`, i.e. `LengthGroupedSampler` (one rank) and
  `DistributedLengthGroupedSampler` (several): a random permutation cut into megabatches of
  `mult x per_device_batch` samples, each sorted by length descending (stable), the longest
  sample's megabatch head swapped to the front; the distributed sampler pads the order to a
  multiple of the world size by repeating its head and gives rank r every W-th index from r; each
  rank's DataLoader then takes `per_device_batch` consecutive indices per step. The step's
  samples are therefore spread over W x per_device_batch positions of the order, across
  megabatch boundaries, which is why several ranks pad far worse than one. Only the permutation's
  source differs from transformers (numpy here, torch.randperm there); `hf_peers` runs the
  real samplers, and a test holds the two within 0.005 at 1 and 8 ranks. `megabatch_order` is
  the order alone (the report's megabatch row), on one stream with the sampler's first rank.
- `lhotse_style`: lhotse's `DynamicBucketingSampler` in its large-buffer limit: bucket boundaries
  of equal total length (equal mass), each bucket's samples shuffled, batches filled while the
  *sum* of lengths stays within `max_duration` (the sample that breaks it opens the next batch;
  a single longer sample travels alone), the batches of all buckets in random order. The sum is
  not the padded size, so batches can exceed the budget once padded: counted, not hidden.

Pure numpy; the per-batch walk of `lhotse_style` is a Python loop over batches, not samples.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.batching import greedy_sizes
from pipeline.core.orders import HF_MEGABATCH_STREAM, LHOTSE_STREAM, megabatch_window
from pipeline.core.orders import megabatch_order as core_megabatch_order

__all__ = ["megabatch_order", "hf_length_grouped", "equal_mass_boundaries", "lhotse_style"]


def megabatch_order(
    lengths: np.ndarray,
    batch_size: int,
    seed: int | tuple = 0,
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
    window = megabatch_window(lengths.size, batch_size, mult)
    rng = np.random.default_rng((seed, HF_MEGABATCH_STREAM))
    return core_megabatch_order(lengths, window, rng, longest_first=longest_first)


def hf_length_grouped(
    lengths: np.ndarray, per_device_batch: int, world_size: int = 1, seed: int | tuple = 0
) -> tuple[np.ndarray, np.ndarray, int]:
    """(sample indices in (step, rank) micro-batch order, micro-batch offsets, steps) of one epoch
    of HF's length-grouped sampling with `per_device_batch` samples per rank and step."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n, b, W = lengths.size, per_device_batch, world_size
    order = megabatch_order(lengths, b, seed)
    per_rank_n = -(-n // W)
    order = np.resize(order, per_rank_n * W)  # DistributedSampler pads by repeating the head
    per_rank = order.reshape(per_rank_n, W).T  # rank r: order[r::W]
    steps = -(-per_rank_n // b)
    sizes = np.full(steps, b, dtype=np.int64)
    if steps:
        sizes[-1] = per_rank_n - b * (steps - 1)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    # (step, rank) order: rank r's s-th batch is per_rank[r, starts[s] : starts[s] + sizes[s]].
    step = np.repeat(np.arange(steps), sizes * W)
    within = np.arange(step.size) - np.repeat(starts * W, sizes * W)
    rank = within // sizes[step]
    col = starts[step] + within % sizes[step]
    ids = per_rank[rank, col]
    offsets = np.concatenate([[0], np.cumsum(np.repeat(sizes, W))])
    return ids, offsets, int(steps)


def equal_mass_boundaries(lengths: np.ndarray, num_buckets: int) -> np.ndarray:
    """Inner bucket boundaries splitting the total length into `num_buckets` equal shares
    (lhotse's `estimate_duration_buckets`); bucket k holds lengths in [b_{k-1}, b_k)."""
    s = np.sort(np.asarray(lengths, dtype=np.int64))
    cs = np.cumsum(s)
    targets = cs[-1] * np.arange(1, num_buckets) / num_buckets
    return np.unique(s[np.minimum(np.searchsorted(cs, targets), s.size - 1)])


def _sum_cut(lens: np.ndarray, max_duration: int) -> np.ndarray:
    """Sizes of batches cut from `lens` while the sum of lengths stays <= max_duration."""
    cs = np.concatenate([[0], np.cumsum(lens)])
    # For a batch starting at i: first index whose running sum from i exceeds max_duration.
    end = np.searchsorted(cs, cs[:-1] + max_duration, side="right") - 1
    end = np.maximum(end, np.arange(lens.size) + 1)  # a single long sample travels alone
    nxt = end.tolist()
    sizes, s = [], 0
    while s < lens.size:
        sizes.append(nxt[s] - s)
        s = nxt[s]
    return np.asarray(sizes, dtype=np.int64)


def lhotse_style(
    lengths: np.ndarray,
    max_duration: int,
    num_buckets: int = 32,
    seed: int = 0,
    epoch: int = 0,
    *,
    strict: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(sample order, global batch sizes) of one epoch of lhotse-style dynamic bucketing.

    `strict=False` is lhotse's default `TimeConstraint` (the sum of lengths bounds a batch);
    `strict=True` bounds size x longest, a hard cap on the unpadded batch."""
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng((seed, epoch, LHOTSE_STREAM))
    bucket = np.searchsorted(equal_mass_boundaries(lengths, num_buckets), lengths, side="right")
    members, sizes = [], []
    for k in np.unique(bucket):
        idx = np.flatnonzero(bucket == k)
        idx = idx[rng.permutation(idx.size)]
        lens = lengths[idx]
        if strict and int(lens.max()) <= max_duration:
            s = greedy_sizes(lens, [lens.size], [int(lens.max())], max_duration)[1]
        else:
            s = _sum_cut(lens, max_duration)
        members.append(idx)
        sizes.append(s)
    order = np.concatenate(members) if members else np.zeros(0, dtype=np.int64)
    sizes = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    pick = rng.permutation(sizes.size)  # batches of all buckets in random order
    new_sizes = sizes[pick]
    pos = np.repeat(starts[pick] - np.concatenate([[0], np.cumsum(new_sizes)[:-1]]), new_sizes)
    return order[pos + np.arange(int(new_sizes.sum()))], new_sizes
