"""Epoch plan: which samples each rank trains on at each global step, as a pure function of seeds.

One type, `EpochPlan`, whatever the batching. Its steps cover consecutive runs of `sample_ids`
(`step_offsets`); each step is split across ranks into one micro-batch per rank, possibly empty,
so all ranks run the same number of steps (contract 3). The layout is padded or packed:

- padded (`epoch_plan`, here): samples are grouped by bucket, permuted within their bucket by
  `default_rng((seed, epoch, bucket))` and cut into global batches sized by a token budget (or
  a fixed count); the global batches of all buckets are put in an epoch-seeded random order
  (`pipeline.core.orders`), and each is split across ranks as evenly as possible
  (`split_offsets`);
- packed (`pipeline.core.packing.pack_epoch`): the plan also holds its rows of whole samples
  (`rows`, a `pipeline.core.rows.PackedRows`), and a rank's micro-batch is its equal share of
  the step's rows, so no row is ever cut.

Keys, rank views, slices (resume), chapters and other world sizes are written once, for both.
Global batches do not depend on the world size, so resuming on another number of workers keeps
the global sample order (contract 8). The content hash is fixed when the epoch is planned and
covers what the planner decided (a packed plan's covers its packing spec too); slices, chapters
and world sizes keep it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from pipeline.core.batching import (
    batches_per_bucket,
    cut_global_batches,
    effective_round_to,
    round_down_to,
)
from pipeline.core.buckets import assign
from pipeline.core.config import Batching, PlanConfig
from pipeline.core.metrics import micro_batch_padded, padding_efficiency
from pipeline.core.orders import bucket_counts, sample_order, step_order
from pipeline.core.rows import PackedRows, check_world_size

__all__ = [
    "EpochPlan",
    "RankView",
    "concat_ranges",
    "epoch_plan",
    "global_batch_sizes",
    "hash_arrays",
    "lengths_and_ids",
    "split_offsets",
    "steps_per_epoch",
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


def steps_per_epoch(
    lengths: np.ndarray, edges, batching: Batching, *, seed: int = 0, epoch: int = 0
) -> int:
    """Global steps in one epoch, the same for every world size; with greedy fill it depends on
    the epoch's shuffle (planned here), otherwise it is the same for every epoch."""
    if batching.mode == "token_budget" and batching.fill == "greedy":
        return epoch_plan(
            lengths, edges, epoch=epoch, world_size=1, batching=batching, plan=PlanConfig(seed=seed)
        ).num_steps
    counts = bucket_counts(assign(lengths, edges), len(edges) - 1)
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
    """The epoch's global steps; step s covers sample_ids[step_offsets[s]:step_offsets[s+1]]."""

    seed: int
    epoch: int
    world_size: int
    edges: np.ndarray
    first_step: int  # > 0 for a plan sliced for resume
    step_bucket: np.ndarray  # [S] bucket of each step (packed: of its first row)
    step_offsets: np.ndarray  # [S + 1] into sample_ids
    sample_ids: np.ndarray  # [N] in (step, position in global batch) order
    lengths: np.ndarray  # [N] aligned with sample_ids
    content_hash: str  # of the whole epoch as planned; the same for every world size and slice
    num_dropped: int = 0  # samples dropped by drop_remainder
    pad_to_multiple_of: int = 8
    rows: PackedRows | None = None  # packed plans: their rows of whole samples
    # A windowed epoch (pipeline.core.windows): [windows + 1] absolute global steps where each
    # window's steps start; None for an epoch of one window. Slices keep it whole.
    window_steps: np.ndarray | None = None

    @property
    def packed(self) -> bool:
        return self.rows is not None

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
    def micro_rows(self) -> np.ndarray | None:
        """Packed: [S, world_size + 1] boundaries, in rows, of each rank's share of each step
        (`split_offsets` over the step's rows). None for a padded plan."""
        return None if self.rows is None else split_offsets(self.rows.step_rows, self.world_size)

    @cached_property
    def micro_offsets(self) -> np.ndarray:
        """[S, world_size + 1] boundaries, in samples, of each rank's micro-batch: the step's
        samples split by `split_offsets` (padded) or at the boundaries of its rows (packed)."""
        if self.rows is None:
            return split_offsets(self.step_offsets, self.world_size)
        return self.rows.row_offsets[self.micro_rows]

    def rank_view(self, rank: int) -> RankView:
        """Rank `rank`'s micro-batches, in step order (empty ones included)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of size {self.world_size}")
        lo, hi = self.micro_offsets[:, rank], self.micro_offsets[:, rank + 1]
        sizes = hi - lo
        idx = concat_ranges(lo, sizes)
        return RankView(
            rank=rank,
            steps=self.first_step + np.arange(self.num_steps),
            buckets=self.step_bucket,
            offsets=np.concatenate([[0], np.cumsum(sizes)]),
            sample_ids=self.sample_ids[idx],
            lengths=self.lengths[idx],
            edges=self.edges,
            **self._rank_rows(rank),
        )

    def _rank_rows(self, rank: int) -> dict:
        """A packed rank view's rows (RankView's row fields); {} for a padded plan."""
        if self.rows is None:
            return {}
        first, row_n = self.micro_rows[:, rank], np.diff(self.micro_rows[:, rank : rank + 2])[:, 0]
        row_sizes = np.diff(self.rows.row_offsets)[concat_ranges(first, row_n)]
        return dict(
            row_offsets=np.concatenate([[0], np.cumsum(row_sizes)]),
            micro_rows=np.concatenate([[0], np.cumsum(row_n)]),
            row_tokens=self.rows.spec.row_tokens,
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

    def slice(self, from_step: int, end_step: int | None = None) -> EpochPlan:
        """The plan of global steps [from_step, end_step) (absolute; end: the plan's end): the
        tail a resume trains, or a chapter. Same steps, ranks, order and hash."""
        end = self.first_step + self.num_steps if end_step is None else end_step
        rel, n = from_step - self.first_step, end - from_step
        if not 0 <= rel <= self.num_steps:
            raise ValueError(
                f"step {from_step} outside plan steps [{self.first_step}, "
                f"{self.first_step + self.num_steps}]"
            )
        if not 0 <= n <= self.num_steps - rel:
            raise ValueError(
                f"end step {end} outside plan steps [{from_step}, {self.first_step + self.num_steps}]"
            )
        lo, hi = int(self.step_offsets[rel]), int(self.step_offsets[rel + n])
        rows = None if self.rows is None else self.rows.from_step(rel).head(n)
        return replace(
            self,
            first_step=from_step,
            step_bucket=self.step_bucket[rel : rel + n],
            step_offsets=self.step_offsets[rel : rel + n + 1] - lo,
            sample_ids=self.sample_ids[lo:hi],
            lengths=self.lengths[lo:hi],
            rows=rows,
        )

    def with_world_size(self, world_size: int) -> EpochPlan:
        """The same global batches split over another number of ranks (contract 8); a packed
        plan refuses a world size that does not divide its rows per step."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if self.rows is not None:
            check_world_size(self.rows.spec.rows_per_step, world_size)
        return replace(self, world_size=world_size)

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

    def table(self) -> dict[str, np.ndarray]:
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


def concat_ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), vectorized."""
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    cum = np.cumsum(sizes) - sizes
    return np.repeat(np.asarray(starts, dtype=np.int64) - cum, sizes) + np.arange(total)


def hash_arrays(head: str, *arrays) -> str:
    """A plan's content hash: 16 hex digits of SHA-256 over `head` (what kind of plan, its
    version and spec) and each array's shape and int64 bytes."""
    h = hashlib.sha256(head.encode())
    for a in arrays:
        a = np.ascontiguousarray(a, dtype=np.int64)
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


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
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    lengths, ids = lengths_and_ids(lengths, sample_ids)
    edges = np.asarray(edges, dtype=np.int64)
    if plan.policy != "bucketed":
        edges = edges[[0, -1]]  # the baselines batch across all lengths
    K = edges.size - 1
    order, counts = sample_order(lengths, ids, assign(lengths, edges), K, plan, batching, epoch)

    g = global_batch_sizes(edges, batching)
    cut = cut_global_batches(lengths[order], counts, edges, batching, g)
    seq, batch = step_order(cut.per_bucket, plan, epoch)
    batch_start, batch_size = cut.start[batch], cut.size[batch]

    if plan.longest_first and seq.size:
        _longest_first(lengths[order], seq, batch_start, batch_size)

    flat = order[concat_ranges(batch_start, batch_size)]
    step_offsets = np.concatenate([[0], np.cumsum(batch_size)]).astype(np.int64)
    sid = ids[flat]
    return EpochPlan(
        seed=plan.seed,
        epoch=epoch,
        world_size=world_size,
        edges=edges,
        first_step=0,
        step_bucket=seq.astype(np.int64),
        step_offsets=step_offsets,
        sample_ids=sid,
        lengths=lengths[flat],
        content_hash=hash_arrays(f"bucketray-plan-v{PLAN_VERSION}", edges, seq, step_offsets, sid),
        num_dropped=cut.dropped,
        pad_to_multiple_of=batching.pad_to_multiple_of,
    )
