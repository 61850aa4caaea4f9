"""Epoch plan: which samples each rank trains on at each global step, as a pure function of seeds.

Samples are grouped by bucket, permuted within their bucket by `default_rng((seed, epoch,
bucket))` and cut into global batches sized by a token budget (or a fixed count); the global
batches of all buckets are then put in an epoch-seeded random order, and each global batch is split
across ranks as evenly as possible. Global batches do not depend on the world size, so resuming
on another number of workers keeps the global sample order (contract 8); every rank gets one
micro-batch, possibly empty, at every step, so all ranks run the same number of steps (contract 3).

A packed plan (pipeline.core.packing) is an EpochPlan whose steps are made of rows of whole
samples (`row_offsets`, `step_rows`): its micro-batches are split at row boundaries, each rank
getting an equal share of a step's rows (`packed_micro_offsets`); keys, slices and chapters are
otherwise the same.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from pipeline.core.batching import (
    batches_per_bucket,
    cut_global_batches,
    effective_round_to,
    round_down_to,
)
from pipeline.core.buckets import assign
from pipeline.core.config import Batching, ConfigError, PlanConfig
from pipeline.core.metrics import micro_batch_padded, padding_efficiency
from pipeline.core.orders import (
    INTERLEAVE_STREAM,
    batch_permutation,
    length_order,
    megabatch_order,
    megabatch_window,
    within_bucket_shuffle,
)
from pipeline.core.orders import MEGABATCH_STREAM as _MEGABATCH_STREAM

__all__ = [
    "EpochPlan",
    "RankView",
    "epoch_plan",
    "global_batch_sizes",
    "length_order",
    "packed_micro_offsets",
    "split_offsets",
    "steps_per_epoch",
    "check_world_size",
    "within_bucket_shuffle",
    "INTERLEAVE_STREAM",
]

PLAN_VERSION = 1


def global_batch_sizes(edges, batching: Batching) -> np.ndarray:
    """Samples per global step for each bucket (contract 2), independent of the world size."""
    uppers = np.asarray(edges, dtype=np.int64)[1:]
    if batching.mode == "fixed":
        return np.full(uppers.size, batching.batch_size, dtype=np.int64)
    g = np.maximum(1, batching.token_budget // uppers)
    return round_down_to(g, effective_round_to(batching))


def split_offsets(step_offsets: np.ndarray, world_size: int) -> np.ndarray:
    """[S, world_size + 1] boundaries of each rank's micro-batch within each global batch
    (np.array_split's rule: the first `n % world_size` ranks get one sample more)."""
    step_offsets = np.asarray(step_offsets, dtype=np.int64)
    n = np.diff(step_offsets)[:, None]
    r = np.arange(world_size + 1)[None, :]
    q, rem = n // world_size, n % world_size
    return step_offsets[:-1, None] + r * q + np.minimum(r, rem)


def packed_micro_offsets(
    row_offsets: np.ndarray, step_rows: np.ndarray, world_size: int
) -> np.ndarray:
    """[S, world_size + 1] boundaries, in samples, of each rank's micro-batch of a packed plan:
    a step's rows split over the ranks by `split_offsets`' rule, so no row is ever cut."""
    return np.asarray(row_offsets, dtype=np.int64)[split_offsets(step_rows, world_size)]


def check_world_size(rows_per_step: int, world_size: int) -> None:
    """Refuse a world size that cannot split every full step of a packed plan into equal
    shares of rows (`batching.rows_per_step`)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if rows_per_step % world_size:
        fits = [w for w in range(1, rows_per_step + 1) if rows_per_step % w == 0]
        raise ConfigError(
            f"batching.rows_per_step={rows_per_step} is not divisible by the world size "
            f"{world_size}: set rows_per_step to a multiple of {world_size} (e.g. "
            f"{rows_per_step + (-rows_per_step) % world_size}) or train on {fits} workers"
        )


def _bucket_counts(bucket: np.ndarray, num_buckets: int) -> np.ndarray:
    return np.bincount(bucket, minlength=num_buckets).astype(np.int64)


def steps_per_epoch(
    lengths: np.ndarray, edges, batching: Batching, *, seed: int = 0, epoch: int = 0
) -> int:
    """Global steps in one epoch, the same for every world size; with greedy fill it depends on
    the epoch's shuffle (planned here), otherwise it is the same for every epoch."""
    if batching.mode == "token_budget" and batching.fill == "greedy":
        return epoch_plan(
            lengths, edges, epoch=epoch, world_size=1, batching=batching, plan=PlanConfig(seed=seed)
        ).num_steps
    counts = _bucket_counts(assign(lengths, edges), len(edges) - 1)
    g = global_batch_sizes(edges, batching)
    return int(batches_per_bucket(counts, g, batching.drop_remainder).sum())


@dataclass(frozen=True)
class RankView:
    """One rank's share of a plan: its sample ids in order and its micro-batch boundaries."""

    rank: int
    steps: np.ndarray  # global step number of each micro-batch
    buckets: np.ndarray  # bucket of each micro-batch
    offsets: np.ndarray  # [num_steps + 1] boundaries into sample_ids
    sample_ids: np.ndarray
    lengths: np.ndarray
    edges: np.ndarray  # the plan's own edges (a baseline's are [0, top], whatever the config's)
    # Packed plans only: [rows + 1] boundaries of the rank's rows in sample_ids, and
    # [num_steps + 1] boundaries of each micro-batch's rows in them.
    row_offsets: np.ndarray | None = None
    micro_rows: np.ndarray | None = None
    row_tokens: int = 0

    def upper(self, m: int) -> int:
        """Micro-batch `m`'s bucket upper edge: the longest it may be padded to."""
        return int(self.edges[int(self.buckets[m]) + 1])


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """The epoch's global steps; step s covers flat[step_offsets[s]:step_offsets[s+1]]."""

    seed: int
    epoch: int
    world_size: int
    edges: np.ndarray
    first_step: int  # > 0 for a plan sliced for resume
    step_bucket: np.ndarray  # [S] bucket of each step
    step_offsets: np.ndarray  # [S + 1] into sample_ids
    sample_ids: np.ndarray  # [N] in (step, position in global batch) order
    lengths: np.ndarray  # [N] aligned with sample_ids
    num_dropped: int = 0  # samples dropped by drop_remainder
    pad_to_multiple_of: int = 8
    _hash_parts: tuple = field(default=(), repr=False)
    # Packed plans only (pipeline.core.packing): rows of whole samples, row_tokens each at most.
    row_offsets: np.ndarray | None = None  # [R + 1] into sample_ids
    step_rows: np.ndarray | None = None  # [S + 1] into rows
    row_tokens: int = 0
    rows_per_step: int = 0  # rows of a full step; the world size must divide it

    @property
    def packed(self) -> bool:
        return self.row_offsets is not None

    @property
    def num_steps(self) -> int:
        return int(self.step_bucket.size)

    @property
    def num_samples(self) -> int:
        return int(self.sample_ids.size)

    @property
    def num_buckets(self) -> int:
        return int(self.edges.size - 1)

    @cached_property
    def micro_offsets(self) -> np.ndarray:
        """[S, world_size + 1] boundaries of each rank's micro-batch (`split_offsets`; packed:
        `packed_micro_offsets`)."""
        if self.packed:
            return packed_micro_offsets(self.row_offsets, self.step_rows, self.world_size)
        return split_offsets(self.step_offsets, self.world_size)

    def rank_view(self, rank: int) -> RankView:
        """Rank `rank`'s micro-batches, in step order (empty ones included)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of size {self.world_size}")
        lo, hi = self.micro_offsets[:, rank], self.micro_offsets[:, rank + 1]
        sizes = hi - lo
        idx = concat_ranges(lo, sizes)
        rows = {}
        if self.packed:
            mr = split_offsets(self.step_rows, self.world_size)
            row_n = mr[:, rank + 1] - mr[:, rank]
            row_sizes = np.diff(self.row_offsets)[concat_ranges(mr[:, rank], row_n)]
            rows = dict(
                row_offsets=np.concatenate([[0], np.cumsum(row_sizes)]),
                micro_rows=np.concatenate([[0], np.cumsum(row_n)]),
                row_tokens=self.row_tokens,
            )
        return RankView(
            rank=rank,
            steps=self.first_step + np.arange(self.num_steps),
            buckets=self.step_bucket,
            offsets=np.concatenate([[0], np.cumsum(sizes)]),
            sample_ids=self.sample_ids[idx],
            lengths=self.lengths[idx],
            edges=self.edges,
            **rows,
        )

    def sort_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """Per sample (aligned with sample_ids): a sort key giving rank-major, step-ordered rows,
        and the number of rows of each rank (the split points after sorting)."""
        mo = self.micro_offsets
        sizes = np.diff(mo, axis=1)  # [S, W]
        # Position of each (step, rank) micro-batch in the rank-major stream.
        per_rank_cum = np.cumsum(sizes, axis=0) - sizes  # rows before this step within the rank
        rank_rows = sizes.sum(axis=0)
        rank_base = np.concatenate([[0], np.cumsum(rank_rows)[:-1]])
        base = rank_base[None, :] + per_rank_cum  # [S, W]
        # Each micro-batch is a contiguous run in the flat array, in (step, rank) order.
        starts = mo[:, :-1].ravel()
        keys = np.empty(self.num_samples, dtype=np.int64)
        flat_sizes = sizes.ravel()
        pos = concat_ranges(starts, flat_sizes)
        keys[pos] = np.repeat(base.ravel(), flat_sizes) + (
            np.arange(pos.size) - np.repeat(np.cumsum(flat_sizes) - flat_sizes, flat_sizes)
        )
        return keys, rank_rows

    def slice(self, from_step: int) -> EpochPlan:
        """The plan from global step `from_step` (absolute) on: the tail used for resume."""
        rel = from_step - self.first_step
        if not 0 <= rel <= self.num_steps:
            raise ValueError(
                f"step {from_step} outside plan steps [{self.first_step}, {self.first_step + self.num_steps}]"
            )
        lo = int(self.step_offsets[rel])
        rows = {}
        if self.packed:
            r0 = int(self.step_rows[rel])
            rows = dict(
                row_offsets=self.row_offsets[r0:] - lo,
                step_rows=self.step_rows[rel:] - r0,
                row_tokens=self.row_tokens,
                rows_per_step=self.rows_per_step,
            )
        return EpochPlan(
            seed=self.seed,
            epoch=self.epoch,
            world_size=self.world_size,
            edges=self.edges,
            first_step=from_step,
            step_bucket=self.step_bucket[rel:],
            step_offsets=self.step_offsets[rel:] - lo,
            sample_ids=self.sample_ids[lo:],
            lengths=self.lengths[lo:],
            num_dropped=self.num_dropped,
            pad_to_multiple_of=self.pad_to_multiple_of,
            _hash_parts=self._hash_parts,
            **rows,
        )

    def with_world_size(self, world_size: int) -> EpochPlan:
        """The same global batches split over another number of ranks (contract 8)."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if self.packed:
            check_world_size(self.rows_per_step, world_size)
        return EpochPlan(**{**_fields(self), "world_size": world_size})

    @cached_property
    def content_hash(self) -> str:
        """Stable hash of the full epoch's global batches; independent of world size and slicing."""
        if self._hash_parts:
            return self._hash_parts[0]
        return _hash(self.edges, self.step_bucket, self.step_offsets, self.sample_ids)

    def micro_batch_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(lengths in rank-micro-batch order, offsets) for every micro-batch of every step and rank."""
        sizes = np.diff(self.micro_offsets, axis=1).ravel()
        return self.lengths, np.concatenate([[0], np.cumsum(sizes)])

    def micro_batch_buckets(self) -> np.ndarray:
        return np.repeat(self.step_bucket, self.world_size)

    def micro_batch_caps(self) -> np.ndarray:
        """Each micro-batch's bucket upper edge in the plan's own edges (a sorted or random
        plan is one bucket, whatever edges a config names)."""
        return self.edges[1:][self.micro_batch_buckets()]

    def micro_batch_padded(self) -> np.ndarray:
        """Tokens each micro-batch is padded to in total (size x padded length, capped at
        `micro_batch_caps`): the one home of "a plan's planned padding", for the driver's epoch
        metrics, the frontier, the report and the benchmarks."""
        lens, offsets = self.micro_batch_lengths()
        return micro_batch_padded(
            lens, offsets, multiple=self.pad_to_multiple_of, cap=self.micro_batch_caps()
        )

    def planned_padding_efficiency(self) -> float:
        """Real tokens over the tokens the plan's micro-batches are padded to (1.0 if none)."""
        lens, offsets = self.micro_batch_lengths()
        return padding_efficiency(
            lens, offsets, multiple=self.pad_to_multiple_of, cap=self.micro_batch_caps()
        )

    def rows(self) -> dict[str, np.ndarray]:
        """Flat rows (step, rank, bucket, slot, sample_id); an empty micro-batch is one row with id -1."""
        sizes = np.diff(self.micro_offsets, axis=1).ravel()  # (step, rank) order
        out_sizes = np.maximum(sizes, 1)
        total = int(out_sizes.sum())
        mb = np.repeat(np.arange(sizes.size), out_sizes)
        slot = np.arange(total) - np.repeat(np.cumsum(out_sizes) - out_sizes, out_sizes)
        sid = np.full(total, -1, dtype=np.int64)
        real = slot < sizes[mb]
        sid[real] = self.sample_ids
        step = mb // self.world_size
        return {
            "step": (self.first_step + step).astype(np.int64),
            "rank": (mb % self.world_size).astype(np.int32),
            "bucket": self.step_bucket[step].astype(np.int32),
            "slot": slot.astype(np.int32),
            "sample_id": sid,
        }

    def summary(self) -> dict:
        """Per-bucket steps, samples and tokens, for epoch/* metrics and reports."""
        K = self.num_buckets
        per_step_n = np.diff(self.step_offsets)
        tok = (
            np.add.reduceat(self.lengths, self.step_offsets[:-1])
            if self.num_samples
            else np.zeros(0)
        )
        tok = np.where(per_step_n > 0, tok, 0)
        return {
            "steps": self.num_steps,
            "samples": self.num_samples,
            "tokens": int(self.lengths.sum()),
            "steps_per_bucket": np.bincount(self.step_bucket, minlength=K).tolist(),
            "samples_per_bucket": np.bincount(self.step_bucket, weights=per_step_n, minlength=K)
            .astype(int)
            .tolist(),
            "tokens_per_bucket": np.bincount(self.step_bucket, weights=tok, minlength=K)
            .astype(int)
            .tolist(),
            "dropped": self.num_dropped,
            "hash": self.content_hash,
        }


def _fields(p: EpochPlan) -> dict:
    return {f: getattr(p, f) for f in p.__dataclass_fields__}


def concat_ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), vectorized."""
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    cum = np.cumsum(sizes) - sizes
    return np.repeat(np.asarray(starts, dtype=np.int64) - cum, sizes) + np.arange(total)


def _hash(*arrays) -> str:
    h = hashlib.sha256(f"bucketray-plan-v{PLAN_VERSION}".encode())
    for a in arrays:
        a = np.ascontiguousarray(a, dtype=np.int64)
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


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


def _bucket_order(
    lengths: np.ndarray,
    ids: np.ndarray,
    bucket: np.ndarray,
    K: int,
    plan: PlanConfig,
    batching: Batching,
    seed: int,
    epoch: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Positions grouped by bucket in the policy's sample order (`pipeline.core.orders`):
    shuffled within each bucket, in length order for the sorted baselines, or in megabatch
    windows; and the count of each bucket."""
    if plan.policy in ("sorted", "sorted_ascending"):
        # Static baseline: length order (ties by id), the same batches every epoch.
        return length_order(lengths, ids), _bucket_counts(bucket, K)
    if plan.policy == "megabatch":
        canonical = np.argsort(ids, kind="stable")  # whatever order the samples came in
        rng = np.random.default_rng((seed, epoch, _MEGABATCH_STREAM))
        window = megabatch_window(lengths.size, _samples_per_batch(lengths, batching))
        order = canonical[megabatch_order(lengths[canonical], window, rng, longest_first=False)]
        return order, _bucket_counts(bucket, K)
    return within_bucket_shuffle(ids, bucket, K, seed, epoch)


def _samples_per_batch(lengths: np.ndarray, batching: Batching) -> int:
    """About how many samples a global batch holds: the megabatch window is ~50 of them."""
    if batching.mode == "fixed":
        return int(batching.batch_size)
    mean = float(lengths.mean()) if lengths.size else 1.0
    return max(1, int(batching.token_budget // max(mean, 1.0)))


def _step_order(
    nb: np.ndarray, plan: PlanConfig, seed: int, epoch: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each step's bucket and its global batch's index among all buckets' batches: an
    epoch-seeded interleaving of all global batches, runs capped at `plan.max_run` (bucketed,
    random); the fixed batches in an epoch-seeded order (sorted); the batches in their cut order
    (sorted_ascending, megabatch: the sample order already is the step order)."""
    total = int(nb.sum())
    if plan.policy == "sorted":
        return np.zeros(total, dtype=np.int64), batch_permutation(total, seed, epoch)
    if plan.policy in ("sorted_ascending", "megabatch"):
        return np.zeros(total, dtype=np.int64), np.arange(total)
    seq = _interleave(nb, np.random.default_rng((seed, epoch, INTERLEAVE_STREAM)))
    if plan.max_run is not None and seq.size:
        seq = _cap_runs(seq, plan.max_run)
    # Batch j of bucket k is the j-th time k appears in seq.
    occ = np.zeros(seq.size, dtype=np.int64)
    if seq.size:
        by_bucket = np.argsort(seq, kind="stable")
        occ[by_bucket] = np.arange(seq.size) - np.repeat(np.cumsum(nb) - nb, nb)
    return seq, (np.cumsum(nb) - nb)[seq] + occ


def _longest_first(
    ordered_lengths: np.ndarray,
    seq: np.ndarray,
    batch_start: np.ndarray,
    batch_size: np.ndarray,
) -> None:
    """Swap the step with the longest sample (ties: the most padded slots) to step 0, in place."""
    maxlen = np.maximum.reduceat(
        ordered_lengths[concat_ranges(batch_start, batch_size)],
        np.concatenate([[0], np.cumsum(batch_size)[:-1]]),
    )
    padded = batch_size * maxlen
    first = int(np.lexsort((padded, maxlen))[-1])
    for a in (seq, batch_start, batch_size):
        a[[0, first]] = a[[first, 0]]


def lengths_and_ids(lengths, sample_ids=None) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, sample ids) as int64 arrays; ids default to positions in `lengths`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ids = (
        np.arange(lengths.size, dtype=np.int64)
        if sample_ids is None
        else np.asarray(sample_ids, dtype=np.int64)
    )
    if ids.shape != lengths.shape:
        raise ValueError(f"sample_ids shape {ids.shape} != lengths shape {lengths.shape}")
    return lengths, ids


def epoch_plan(
    lengths: np.ndarray,
    edges,
    *,
    epoch: int,
    world_size: int,
    batching: Batching,
    plan: PlanConfig | None = None,
    sample_ids: np.ndarray | None = None,
) -> EpochPlan:
    """Plan one padded epoch (contracts 1-5, 8) under `plan` (its policy and its seed).
    `sample_ids` default to positions in `lengths`."""
    plan = plan or PlanConfig()
    seed = plan.seed
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    lengths, ids = lengths_and_ids(lengths, sample_ids)
    edges = np.asarray(edges, dtype=np.int64)
    if plan.policy != "bucketed":
        edges = edges[[0, -1]]  # the baselines batch across all lengths
    K = edges.size - 1
    order, counts = _bucket_order(
        lengths, ids, assign(lengths, edges), K, plan, batching, seed, epoch
    )

    g = global_batch_sizes(edges, batching)
    cut = cut_global_batches(lengths[order], counts, edges, batching, g)
    nb, num_dropped = cut.per_bucket, cut.dropped

    seq, batch = _step_order(nb, plan, seed, epoch)
    batch_start, batch_size = cut.start[batch], cut.size[batch]

    if plan.longest_first and seq.size:
        _longest_first(lengths[order], seq, batch_start, batch_size)

    flat = order[concat_ranges(batch_start, batch_size)]
    step_offsets = np.concatenate([[0], np.cumsum(batch_size)]).astype(np.int64)
    sid = ids[flat]
    lens = lengths[flat]
    h = _hash(edges, seq, step_offsets, sid)
    return EpochPlan(
        seed=seed,
        epoch=epoch,
        world_size=world_size,
        edges=edges,
        first_step=0,
        step_bucket=seq.astype(np.int64),
        step_offsets=step_offsets,
        sample_ids=sid,
        lengths=lens,
        num_dropped=num_dropped,
        pad_to_multiple_of=batching.pad_to_multiple_of,
        _hash_parts=(h,),
    )
