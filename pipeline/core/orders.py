"""Sample and step orders of the batching policies, and every RNG stream tag of the project.

Randomness comes from `np.random.default_rng((seed, epoch, tag))` or `((seed, tag))`: a bucket's
within-bucket shuffle uses its bucket index as the tag (contract 1), every other stream one of the
tags below. `tests/unit/test_rng_streams.py` starts every stream over a grid of seeds, epochs and
buckets and compares the generators' states: none coincide but two it names, a corpus's and a
benchmark's stream that equal a plan's bucket-0 shuffle of one epoch (SeedSequence pads entropy
with zeros), kept so corpora and published figures reproduce. Pure numpy.

The policies (`plan.policy`):

- `bucketed`: each bucket's samples shuffled per epoch (`within_bucket_shuffle`), global batches
  cut per bucket and interleaved in an epoch-seeded order (`step_order`), runs capped at
  `plan.max_run`.
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

from pipeline.core.config import Batching, PlanConfig

__all__ = [
    "INTERLEAVE_STREAM",
    "STEP_STREAM",
    "ROW_STREAM",
    "SORTED_ORDER_STREAM",
    "MEGABATCH_STREAM",
    "EVAL_SUBSET_STREAM",
    "WINDOW_STREAM",
    "PLAN_STREAMS",
    "REPORT_RANDOM_STREAM",
    "HF_MEGABATCH_STREAM",
    "LHOTSE_STREAM",
    "PAIR_REPEAT_STREAM",
    "JUMPINESS_BAND_STREAM",
    "SYNTHETIC_LENGTHS_STREAM",
    "SYNTHETIC_VOCAB_STREAM",
    "SYNTHETIC_NOISE_STREAM",
    "MEGABATCH_MULT",
    "batch_permutation",
    "bucket_counts",
    "length_order",
    "megabatch_order",
    "megabatch_window",
    "plan_rng",
    "sample_order",
    "step_order",
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
# The permutation of a windowed epoch's row groups, (seed, epoch, tag); and, as the fourth entry
# before the window number, every stream of windows 1, 2, ... (`plan_rng`).
WINDOW_STREAM = 2**31 - 7
PLAN_STREAMS = (
    INTERLEAVE_STREAM,
    STEP_STREAM,
    ROW_STREAM,
    SORTED_ORDER_STREAM,
    MEGABATCH_STREAM,
    EVAL_SUBSET_STREAM,
    WINDOW_STREAM,
)

# The report's (pipeline/report) and the benchmarks' (bench/) streams, with the values they were
# published with, so their figures reproduce: ASCII "RAND", "MEGA", "LHTO".
REPORT_RANDOM_STREAM = 0x52414E44  # (seed, tag): the fixed-batch-size random row
# (seed, tag): the report's megabatch row and its Hugging Face peer, one stream so that one
# rank of the peer draws the very permutation the megabatch row does.
HF_MEGABATCH_STREAM = 0x4D454741
LHOTSE_STREAM = 0x4C48544F  # (seed, epoch, tag): the lhotse-style peer
PAIR_REPEAT_STREAM = 17  # (seed, tag): the sample pairs bench.packing draws
# (tag,): the resampled steps of a jumpiness reading's bands (pipeline.core.jumpiness): ASCII "JUMP"
JUMPINESS_BAND_STREAM = 0x4A554D50

# The synthetic corpus's streams (pipeline.core.synthetic); changing one changes every corpus.
SYNTHETIC_LENGTHS_STREAM = 902_087  # (seed, tag): the seed902k lengths
SYNTHETIC_VOCAB_STREAM = 1  # (seed, tag): the vocabulary permutation the tokens walk
SYNTHETIC_NOISE_STREAM = 2  # (seed, tag, first sample id, samples): a shard's noise tokens

# transformers.trainer_pt_utils.get_length_grouped_indices: megabatch_mult defaults to
# min(len(lengths) // (batch_size * 4), 50), at least 1.
MEGABATCH_MULT = 50


def plan_rng(seed: int, epoch: int, tag: int, window: int = 0) -> np.random.Generator:
    """A plan's stream `tag` (a bucket index, or one of the tags above) for `epoch`: in window 0
    (and an epoch of one window) `(seed, epoch, tag)`, so one window is the global plan; in window
    w >= 1 `(seed, epoch, tag, WINDOW_STREAM, w)`, a stream of its own."""
    if window == 0:
        return np.random.default_rng((seed, epoch, tag))
    return np.random.default_rng((seed, epoch, tag, WINDOW_STREAM, window))


def length_order(lengths: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Positions of the samples by ascending length, ties by sample id: the sorted baseline."""
    return np.lexsort((ids, lengths))


def bucket_counts(bucket: np.ndarray, num_buckets: int) -> np.ndarray:
    """Samples in each bucket."""
    return np.bincount(bucket, minlength=num_buckets).astype(np.int64)


def within_bucket_shuffle(
    ids: np.ndarray, bucket: np.ndarray, K: int, seed: int, epoch: int, window: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Contract 1's one home, for padded and packed plans: positions grouped by bucket, each
    bucket's members (canonical: in sample-id order, whatever the input order) permuted by
    `default_rng((seed, epoch, bucket))` (a window's own stream in window >= 1, `plan_rng`); and
    the count of each bucket."""
    order = np.lexsort((ids, bucket))
    counts = bucket_counts(bucket, K)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for k in range(K):
        if counts[k] > 1:
            perm = plan_rng(seed, epoch, k, window).permutation(int(counts[k]))
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


def sample_order(
    lengths: np.ndarray,
    ids: np.ndarray,
    bucket: np.ndarray,
    K: int,
    plan: PlanConfig,
    batching: Batching,
    epoch: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Positions grouped by bucket in the policy's sample order: shuffled within each bucket, in
    length order for the sorted baselines, or in megabatch windows; and the count of each bucket."""
    if plan.policy in ("sorted", "sorted_ascending"):
        # Static baseline: length order (ties by id), the same batches every epoch.
        return length_order(lengths, ids), bucket_counts(bucket, K)
    if plan.policy == "megabatch":
        canonical = np.argsort(ids, kind="stable")  # whatever order the samples came in
        rng = np.random.default_rng((plan.seed, epoch, MEGABATCH_STREAM))
        window = megabatch_window(lengths.size, _samples_per_batch(lengths, batching))
        order = canonical[megabatch_order(lengths[canonical], window, rng, longest_first=False)]
        return order, bucket_counts(bucket, K)
    return within_bucket_shuffle(ids, bucket, K, plan.seed, epoch)


def _samples_per_batch(lengths: np.ndarray, batching: Batching) -> int:
    """About how many samples a global batch holds: the megabatch window is ~50 of them."""
    if batching.mode == "fixed":
        return int(batching.batch_size)
    mean = float(lengths.mean()) if lengths.size else 1.0
    return max(1, int(batching.token_budget // max(mean, 1.0)))


def step_order(
    nb: np.ndarray, plan: PlanConfig, epoch: int, window: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Each step's bucket and its global batch's index among all buckets' batches (`nb`: the
    batches of each bucket): an epoch-seeded interleaving of all global batches, runs capped at
    `plan.max_run` (bucketed, random); the fixed batches in an epoch-seeded order (sorted); the
    batches in their cut order (sorted_ascending, megabatch: the sample order already is the
    step order)."""
    total = int(nb.sum())
    if plan.policy == "sorted":
        return np.zeros(total, dtype=np.int64), batch_permutation(total, plan.seed, epoch)
    if plan.policy in ("sorted_ascending", "megabatch"):
        return np.zeros(total, dtype=np.int64), np.arange(total)
    seq = _interleave(nb, plan_rng(plan.seed, epoch, INTERLEAVE_STREAM, window))
    if plan.max_run is not None and seq.size:
        seq = _cap_runs(seq, plan.max_run)
    # Batch j of bucket k is the j-th time k appears in seq.
    occ = np.zeros(seq.size, dtype=np.int64)
    if seq.size:
        by_bucket = np.argsort(seq, kind="stable")
        occ[by_bucket] = np.arange(seq.size) - np.repeat(np.cumsum(nb) - nb, nb)
    return seq, (np.cumsum(nb) - nb)[seq] + occ


def _interleave(counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random order of the global batches' buckets (contract 5)."""
    seq = np.repeat(np.arange(counts.size), counts)
    rng.shuffle(seq)
    return seq


def _cap_runs(seq: np.ndarray, max_run: int) -> np.ndarray:
    """Move steps later so that no bucket runs more than max_run times in a row, where possible.

    O(steps) with a forward scan; a step pulled forward keeps its bucket's batch order intact
    because batch numbers are assigned after this reordering.
    """
    seq = seq.copy()
    n = seq.size
    run = 1
    for i in range(1, n):
        if seq[i] != seq[i - 1]:
            run = 1
            continue
        if run < max_run:
            run += 1
            continue
        # seq[i] would extend a run past max_run: swap in the next step of another bucket.
        diff = np.flatnonzero(seq[i + 1 :] != seq[i])
        if diff.size == 0:
            break  # only this bucket is left; the cap cannot hold
        j = i + 1 + diff[0]
        seq[i], seq[j] = seq[j], seq[i]
        run = 1
    return seq
