"""Packed epochs: whole samples best-fit into fixed-size rows, rows balanced across ranks.

Padding-free training concatenates samples into rows of `row_tokens` tokens and lets each
document attend only to itself (pipeline.learn.packed_attention), so the price of a step is no
longer its padding but its work, which this module models and balances. Everything here is a pure
function of (lengths, edges, seed, epoch, spec):

1. Shuffle: each bucket's samples are permuted by `default_rng((seed, epoch, bucket))` (contract
   1; edges [0, top] make it one full shuffle).
2. Pack: each bucket's stream is packed best-fit into a bounded window of `open_rows` open rows:
   a sample goes to the open row with the least room that still holds it; if none does, a new row
   opens, closing the fullest open row when the window is full. A sample is never split, so every
   sample appears exactly once, in exactly one row (contract 4); a row closes once it cannot take
   the epoch's shortest sample. The window keeps the packing local, so rows keep the shuffle's
   diversity (which samples share a row is as random as the shuffle), at a fill close to global
   best-fit's. Buckets' rows are then interleaved in an epoch-seeded random order.
3. Balance: rows are grouped into windows of `balance_rows` rows; within a window rows are sorted
   by cost and cut into global steps of `rows_per_step` consecutive rows, so the rows of a step
   (and hence its ranks) cost nearly the same. Within a step rows are stored heaviest, lightest,
   second heaviest, second lightest, ..., so any contiguous split over a world size dividing
   `rows_per_step` pairs heavy with light rows.
4. Order: sorting within windows makes steps of similar rows, heavy steps first in each window;
   the order of all steps is then an epoch-seeded permutation (`default_rng((seed, epoch,
   STEP_STREAM))`), so no trend of cost or length survives within an epoch. The costliest step
   goes first when `longest_first` is on (an out-of-memory shows at step 1).

COST MODEL (declared once, here). A document of L tokens costs `L + L**2 / attention_width`
units, a row of `row_tokens` tokens costs `row_tokens + sum(L**2) / attention_width` to run
(its linear layers see every slot, attention only each document's causal square). Per token a
decoder layer's linear maps do ~12 d**2 multiply-adds (QKV, output, a 4x MLP) and attention
~2 d i at position i (scores and values), i.e. d L**2 per document if the kernel skips the masked
half, 2 d L**2 if it does not; dividing by 12 d**2 gives `attention_width` = 12 d (causal blocks
skipped) or 6 d (dense score blocks), d the model width. `attention_width_for(d_model)` returns
6 d, the conservative choice (flash kernels skip only whole masked tiles).

Global steps never depend on the world size (contract 8): `rows_per_step` rows per step, split
over the ranks with `plan.split_offsets`; a world size that does not divide `rows_per_step` is
refused (`rows.check_world_size`). The last step of the epoch may hold fewer rows (the
remainder, split as evenly as possible, so a rank may get none: an empty micro-batch, contract 4).

`pack_epoch` returns the one plan type, an `EpochPlan` holding its rows
(`pipeline.core.rows.PackedRows`); `row_costs`, `rank_costs` and `packed_summary` are a packed
plan's figures under the cost model.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from pipeline.core.buckets import assign
from pipeline.core.orders import ROW_STREAM, STEP_STREAM, plan_rng, within_bucket_shuffle
from pipeline.core.plan import EpochPlan, concat_ranges, hash_arrays, lengths_and_ids
from pipeline.core.rows import PackedRows, PackingSpec, check_world_size
from pipeline.core.sections import ConfigError

__all__ = [
    "PackingSpec",
    "attention_width_for",
    "best_fit_rows",
    "doc_cost",
    "pack_epoch",
    "packed_summary",
    "rank_costs",
    "row_costs",
]

PACK_VERSION = 1


def attention_width_for(d_model: int) -> int:
    """The cost model's attention width for a decoder of width d_model (module docstring)."""
    return 6 * int(d_model)


def doc_cost(lengths: np.ndarray, attention_width: int) -> np.ndarray:
    """Useful work of each document under the cost model: L + L**2 / attention_width."""
    L = np.asarray(lengths, dtype=np.float64)
    return L + L * L / attention_width


def best_fit_rows(lengths, row_tokens: int, open_rows: int, min_len: int | None = None):
    """Best-fit of `lengths` (in stream order) into rows of `row_tokens`, `open_rows` open at once.

    Returns (row of each sample, rows in the order they closed): row ids count rows as they open.
    The open rows' room is kept sorted, so each placement is a bisection and two list edits (C
    speed on a list of at most `open_rows` entries); this Python loop over samples is the only
    non-vectorized part of planning a packed epoch.
    """
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.size and int(lens.max()) > row_tokens:
        raise ConfigError(
            f"a sample of {int(lens.max())} tokens does not fit batching.row_tokens={row_tokens}: "
            f"raise row_tokens to at least {int(lens.max())} (samples are never split)"
        )
    floor = int(lens.min()) if min_len is None and lens.size else int(min_len or 1)
    room: list[int] = []  # ascending room of the open rows
    rid: list[int] = []  # their row ids, aligned with room
    closed: list[int] = []
    row_of = [0] * lens.size
    nxt = 0
    # Bound methods as locals: this loop runs once per sample (~0.9 M at the preset).
    bisect, close = bisect_left, closed.append
    room_pop, rid_pop, room_ins, rid_ins = room.pop, rid.pop, room.insert, rid.insert
    for i, n in enumerate(lens.tolist()):
        j = bisect(room, n)
        if j < len(room):
            r = rid_pop(j)
            left = room_pop(j) - n
        else:
            if len(room) == open_rows:
                close(rid_pop(0))  # the fullest open row makes way
                room_pop(0)
            r, nxt, left = nxt, nxt + 1, row_tokens - n
        row_of[i] = r
        if left < floor:
            close(r)  # it can take no sample of this epoch any more
        else:
            k = bisect(room, left)
            room_ins(k, left)
            rid_ins(k, r)
    closed.extend(sorted(rid))  # the stream's end closes the rest, oldest first
    return np.asarray(row_of, dtype=np.int64), np.asarray(closed, dtype=np.int64)


def row_costs(plan: EpochPlan) -> np.ndarray:
    """Each row's cost to run under the cost model: row_tokens + sum(L**2) / attention_width."""
    spec = plan.rows.spec
    L = plan.lengths.astype(np.float64)
    return spec.row_tokens + _segment_sums(L * L, plan.rows.row_offsets) / spec.attention_width


def rank_costs(plan: EpochPlan) -> np.ndarray:
    """[S, world_size] cost each rank of a packed plan runs at each step (a rank without rows:
    0)."""
    cum = np.concatenate([[0.0], np.cumsum(row_costs(plan))])
    return np.diff(cum[plan.micro_rows], axis=1)


def packed_summary(plan: EpochPlan) -> dict:
    """Steps, rows, samples, fill and rank balance of a packed plan (the epoch/* packing
    metrics, the report's packed figures): rank_max_over_mean is the sum over steps of the
    costliest rank's cost over the mean rank's, useful_over_paid the documents' cost (`doc_cost`)
    over what the costliest rank of every step makes all ranks pay."""
    if plan.rows is None:
        raise ValueError("a padded plan has no rows: plan it with batching.mode=packed")
    spec, num_rows = plan.rows.spec, plan.rows.num_rows
    costs = rank_costs(plan)
    paid = float(costs.max(axis=1).sum() * plan.world_size) if costs.size else 0.0
    useful = float(doc_cost(plan.lengths, spec.attention_width).sum())
    mean = costs.mean(axis=1) if costs.size else np.zeros(0)
    return {
        "steps": plan.num_steps,
        "rows": num_rows,
        "samples": plan.num_samples,
        "tokens": int(plan.lengths.sum()),
        "row_fill": float(plan.lengths.sum() / max(num_rows * spec.row_tokens, 1)),
        "docs_per_row": plan.num_samples / max(num_rows, 1),
        "rank_max_over_mean": float(costs.max(axis=1).sum() / max(mean.sum(), 1e-12)),
        "useful_over_paid": useful / paid if paid else 0.0,
        "hash": plan.content_hash,
    }


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    cum = np.concatenate([[0], np.cumsum(values)])
    return np.diff(cum[offsets])


def bucket_rows(lengths, order, counts, spec, floor: int):
    """Each bucket's rows (best-fit of its samples in `order`, bucket after bucket, counts[k] of
    bucket k): a list of (bucket, sample positions in row order, row sizes), rows in closing
    order."""
    starts = np.concatenate([[0], np.cumsum(counts)])
    out = []
    for k in np.flatnonzero(counts):
        pos = order[starts[k] : starts[k + 1]]
        row_of, closed = best_fit_rows(lengths[pos], spec.row_tokens, spec.open_rows, floor)
        place = np.empty(closed.size, dtype=np.int64)
        place[closed] = np.arange(closed.size)
        # Rows in closing order, each row's samples in arrival order.
        members = pos[np.lexsort((np.arange(pos.size), place[row_of]))]
        out.append((int(k), members, np.bincount(place[row_of], minlength=closed.size)))
    return out


def interleave_rows(per_bucket, K: int, seed: int, epoch: int, window: int = 0):
    """The buckets' row streams interleaved in an epoch-seeded random order that keeps each
    bucket's rows in their closing order: (sample positions in row order, row sizes, row
    bucket)."""
    if not per_bucket:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    members = [m for _, m, _ in per_bucket]
    sizes = [z for _, _, z in per_bucket]
    row_bucket = [np.full(z.size, k, dtype=np.int64) for k, _, z in per_bucket]
    if len(members) == 1:
        return members[0], sizes[0], row_bucket[0]
    rb = np.concatenate(row_bucket)
    seq = rb.copy()
    plan_rng(seed, epoch, ROW_STREAM, window).shuffle(seq)
    nb = np.bincount(rb, minlength=K)
    occ = np.empty(seq.size, dtype=np.int64)
    by = np.argsort(seq, kind="stable")
    occ[by] = np.arange(seq.size) - np.repeat(np.cumsum(nb) - nb, nb)
    row_index = (np.cumsum(nb) - nb)[seq] + occ  # which concatenated row goes at each place
    all_sizes = np.concatenate(sizes)
    all_starts = np.concatenate([[0], np.cumsum(all_sizes)[:-1]])
    flat = np.concatenate(members)[concat_ranges(all_starts[row_index], all_sizes[row_index])]
    return flat, all_sizes[row_index], rb[row_index]


def row_cost(lengths: np.ndarray, flat: np.ndarray, row_size: np.ndarray, spec) -> np.ndarray:
    """Each row's cost under the cost model, rows given by their samples' positions in order."""
    row_offsets = np.concatenate([[0], np.cumsum(row_size)]).astype(np.int64)
    L = lengths[flat].astype(np.float64)
    return spec.row_tokens + _segment_sums(L * L, row_offsets) / spec.attention_width


def balanced_steps(
    cost: np.ndarray,
    spec: PackingSpec,
    seed: int,
    epoch: int,
    window: int = 0,
    longest_first: bool | None = None,
):
    """Row order (steps of rows_per_step rows, balanced within windows, steps shuffled) and the
    number of rows of each step; the costliest step first with `longest_first` (default: the
    spec's)."""
    R, nrows = spec.rows_per_step, cost.size
    win = spec.window_steps * R
    w = np.arange(nrows) // win
    by_cost = np.lexsort((np.arange(nrows), -cost, w))  # each window heaviest first
    pos_in_win = np.arange(nrows) - w[by_cost] * win
    step = w[by_cost] * spec.window_steps + pos_in_win // R  # steps numbered in window order
    num_steps = int(step[-1]) + 1 if nrows else 0
    step_size = np.bincount(step, minlength=num_steps)
    # Fold each step: heaviest, lightest, 2nd heaviest, 2nd lightest, ...
    j = pos_in_win % R
    n = step_size[step]
    fold = np.where(j < (n + 1) // 2, 2 * j, 2 * (n - 1 - j) + 1)
    in_step = by_cost[np.lexsort((fold, step))]
    # Steps in an epoch-seeded random order; the costliest first if asked.
    step_cost = np.bincount(step, weights=cost[by_cost], minlength=num_steps)
    perm = plan_rng(seed, epoch, STEP_STREAM, window).permutation(num_steps)
    first = spec.longest_first if longest_first is None else longest_first
    if first and num_steps:
        top = int(np.flatnonzero(perm == int(np.argmax(step_cost)))[0])
        perm[[0, top]] = perm[[top, 0]]
    starts = np.concatenate([[0], np.cumsum(step_size)[:-1]])
    rows = in_step[concat_ranges(starts[perm], step_size[perm])]
    return rows, step_size[perm]


def pack_epoch(
    lengths: np.ndarray,
    edges,
    *,
    seed: int,
    epoch: int,
    world_size: int,
    spec: PackingSpec,
    sample_ids: np.ndarray | None = None,
    pad_to_multiple_of: int = 8,
) -> EpochPlan:
    """Plan one packed epoch (module docstring): an EpochPlan with its rows. `sample_ids`
    default to positions in `lengths`; edges [0, top] give a full shuffle."""
    check_world_size(spec.rows_per_step, world_size)
    lengths, ids = lengths_and_ids(lengths, sample_ids)
    edges = np.asarray(edges, dtype=np.int64)
    if edges[-1] > spec.row_tokens:
        raise ConfigError(
            f"batching.row_tokens={spec.row_tokens} is below the top bucket edge {int(edges[-1])}: "
            f"raise row_tokens to at least {int(edges[-1])} (samples are never split)"
        )
    K = edges.size - 1
    by_bucket, counts = within_bucket_shuffle(ids, assign(lengths, edges), K, seed, epoch)
    floor = int(lengths.min()) if lengths.size else 1
    flat, row_size, row_bucket = interleave_rows(
        bucket_rows(lengths, by_bucket, counts, spec, floor), K, seed, epoch
    )
    row_offsets = np.concatenate([[0], np.cumsum(row_size)]).astype(np.int64)
    cost = row_cost(lengths, flat, row_size, spec)
    order, step_size = balanced_steps(cost, spec, seed, epoch)
    flat = flat[concat_ranges(row_offsets[:-1][order], row_size[order])]
    return packed_plan(
        flat,
        row_size[order],
        row_bucket[order],
        step_size,
        ids=ids,
        lengths=lengths,
        edges=edges,
        seed=seed,
        epoch=epoch,
        world_size=world_size,
        spec=spec,
        pad_to_multiple_of=pad_to_multiple_of,
    )


def packed_plan(
    flat: np.ndarray,
    row_size: np.ndarray,
    row_bucket: np.ndarray,
    step_size: np.ndarray,
    *,
    ids: np.ndarray,
    lengths: np.ndarray,
    edges: np.ndarray,
    seed: int,
    epoch: int,
    world_size: int,
    spec: PackingSpec,
    pad_to_multiple_of: int,
    window_steps: np.ndarray | None = None,
) -> EpochPlan:
    """The EpochPlan of packed rows in their order: `flat` (positions in `lengths` and `ids`,
    row by row), each row's size and bucket, each step's rows; `window_steps`: where each window
    of a windowed epoch starts (its hash then says so, `pipeline.core.windows`)."""
    row_offsets = np.concatenate([[0], np.cumsum(row_size)]).astype(np.int64)
    step_rows = np.concatenate([[0], np.cumsum(step_size)]).astype(np.int64)
    sid = ids[flat]
    rows = PackedRows(
        spec=spec, row_offsets=row_offsets, step_rows=step_rows, row_bucket=row_bucket
    )
    tag, windows = f"bucketray-packed-v{PACK_VERSION}{spec!r}", ()
    if window_steps is not None:
        tag, windows = f"{tag}-windows", (np.unique(window_steps),)
    return EpochPlan(
        seed=seed,
        epoch=epoch,
        world_size=world_size,
        edges=edges,
        first_step=0,
        step_bucket=rows.step_bucket,
        step_offsets=rows.step_offsets,
        sample_ids=sid,
        lengths=lengths[flat],
        content_hash=hash_arrays(tag, edges, *windows, step_rows, row_offsets, sid),
        pad_to_multiple_of=pad_to_multiple_of,
        rows=rows,
        window_steps=window_steps,
    )
