"""Sample orders of the batching policies, and every RNG stream tag of the project.

Randomness comes from `np.random.default_rng((seed, epoch, tag))` or `((seed, tag))`: a bucket's
within-bucket shuffle uses its bucket index as the tag (contract 1), every other stream one of the
tags below. `tests/unit/test_rng_streams.py` starts every stream over a grid of seeds, epochs and
buckets and compares the generators' states: none coincide but two it names, a corpus's and a
benchmark's stream that equal a plan's bucket-0 shuffle of one epoch (SeedSequence pads entropy
with zeros), kept so corpora and published figures reproduce. Pure numpy.

The policies (`plan.policy`):

- `bucketed`: each bucket's samples shuffled per epoch (`within_bucket_shuffle`), global batches
  cut per bucket and interleaved in an epoch-seeded order (pipeline.core.plan).
- `sorted`: the classic static baseline. All samples in length order (ties by sample id) cut
  into batches: the same batches every epoch, their ORDER drawn per epoch (`batch_permutation`),
  so no epoch is a length curriculum.
- `sorted_ascending`: the same batches from shortest to longest every epoch: a length
  curriculum, repeated each epoch (only on purpose: it ends every epoch on the longest samples).
- `random`: one epoch-seeded permutation of all samples (edges [0, top], one bucket).
- `megabatch`: Hugging Face's `group_by_length`: an epoch-seeded permutation cut into windows of
  about 50 batches, each window sorted by length, longest first (`megabatch_order`).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "INTERLEAVE_STREAM",
    "STEP_STREAM",
    "ROW_STREAM",
    "SORTED_ORDER_STREAM",
    "MEGABATCH_STREAM",
    "EVAL_SUBSET_STREAM",
    "PLAN_STREAMS",
    "REPORT_RANDOM_STREAM",
    "HF_MEGABATCH_STREAM",
    "LHOTSE_STREAM",
    "PAIR_REPEAT_STREAM",
    "SYNTHETIC_LENGTHS_STREAM",
    "SYNTHETIC_VOCAB_STREAM",
    "SYNTHETIC_NOISE_STREAM",
    "MEGABATCH_MULT",
    "batch_permutation",
    "length_order",
    "megabatch_order",
    "megabatch_window",
    "within_bucket_shuffle",
]

# The plans' streams, (seed, epoch, tag) (EVAL_SUBSET_STREAM: the tag alone); a bucket index k
# is always far below them.
INTERLEAVE_STREAM = 2**31 - 1  # the order of a bucketed epoch's global batches
STEP_STREAM = 2**31 - 2  # the order of a packed epoch's steps
ROW_STREAM = 2**31 - 3  # the order of a packed epoch's rows across buckets
SORTED_ORDER_STREAM = 2**31 - 4  # the order of the sorted baseline's fixed batches
MEGABATCH_STREAM = 2**31 - 5  # the permutation the megabatch windows are cut from
EVAL_SUBSET_STREAM = 2**31 - 6  # eval.max_samples: which held-out samples (no seed, no epoch)
PLAN_STREAMS = (
    INTERLEAVE_STREAM,
    STEP_STREAM,
    ROW_STREAM,
    SORTED_ORDER_STREAM,
    MEGABATCH_STREAM,
    EVAL_SUBSET_STREAM,
)

# The report's and the benchmarks' streams (bench/), with the values they were published with,
# so their figures reproduce: ASCII "RAND", "MEGA", "LHTO".
REPORT_RANDOM_STREAM = 0x52414E44  # (seed, tag): the fixed-batch-size random row
# (seed, tag): the report's megabatch row and its Hugging Face peer, one stream so that one
# rank of the peer draws the very permutation the megabatch row does.
HF_MEGABATCH_STREAM = 0x4D454741
LHOTSE_STREAM = 0x4C48544F  # (seed, epoch, tag): the lhotse-style peer
PAIR_REPEAT_STREAM = 17  # (seed, tag): the sample pairs bench.packing draws

# The synthetic corpus's streams (pipeline.core.synthetic); changing one changes every corpus.
SYNTHETIC_LENGTHS_STREAM = 902_087  # (seed, tag): the seed902k lengths
SYNTHETIC_VOCAB_STREAM = 1  # (seed, tag): the vocabulary permutation the tokens walk
SYNTHETIC_NOISE_STREAM = 2  # (seed, tag, first sample id, samples): a shard's noise tokens

# transformers.trainer_pt_utils.get_length_grouped_indices: megabatch_mult defaults to
# min(len(lengths) // (batch_size * 4), 50), at least 1.
MEGABATCH_MULT = 50


def length_order(lengths: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Positions of the samples by ascending length, ties by sample id: the sorted baseline."""
    return np.lexsort((ids, lengths))


def within_bucket_shuffle(
    ids: np.ndarray, bucket: np.ndarray, K: int, seed: int, epoch: int
) -> tuple[np.ndarray, np.ndarray]:
    """Contract 1's one home, for padded and packed plans: positions grouped by bucket, each
    bucket's members (canonical: in sample-id order, whatever the input order) permuted by
    `default_rng((seed, epoch, bucket))`; and the count of each bucket."""
    order = np.lexsort((ids, bucket))
    counts = np.bincount(bucket, minlength=K).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for k in range(K):
        if counts[k] > 1:
            perm = np.random.default_rng((seed, epoch, k)).permutation(int(counts[k]))
            order[starts[k] : starts[k + 1]] = order[starts[k] : starts[k + 1]][perm]
    return order, counts


def batch_permutation(num_batches: int, seed: int, epoch: int) -> np.ndarray:
    """The sorted baseline's step order: its fixed batches in an epoch-seeded random order."""
    return np.random.default_rng((seed, epoch, SORTED_ORDER_STREAM)).permutation(num_batches)


def megabatch_window(n: int, batch_size: int, mult: int | None = None) -> int:
    """Samples per megabatch window: `mult` batches, by default Hugging Face's
    min(n // (4 * batch_size), 50), at least 1."""
    batch_size = max(1, int(batch_size))
    if mult is None:
        mult = max(1, min(n // (batch_size * 4), MEGABATCH_MULT))
    return int(mult) * batch_size


def megabatch_order(
    lengths: np.ndarray, window: int, rng: np.random.Generator, *, longest_first: bool = True
) -> np.ndarray:
    """Hugging Face `group_by_length` order: a random permutation (from `rng`) cut into windows
    of `window` samples, each window sorted by length descending (stable, like Python's
    `sorted(..., reverse=True)`). With `longest_first`, the head of the window holding the
    longest sample is swapped with the head of window 0, as HF does, so an OOM shows at once."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.size
    perm = rng.permutation(n)
    order = perm[np.lexsort((-lengths[perm], np.arange(n) // max(1, int(window))))]
    if longest_first and n:
        heads = np.arange(0, n, max(1, int(window)))
        j = heads[int(np.argmax(lengths[order[heads]]))]
        order[[0, j]] = order[[j, 0]]
    return order
