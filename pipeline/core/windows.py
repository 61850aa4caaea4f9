"""Windowed epochs: the corpus's row groups permuted per (seed, epoch) and cut into windows of
about `plan.window_tokens` real tokens, each window planned on its own (pure numpy).

A global within-bucket shuffle draws every chapter's samples from nearly every row group, so an
epoch prepared in C pieces reads the corpus C times (`pipeline.core.chapters`). A windowed epoch
reads each row group with its window:

1. Windows: the row groups are permuted by `plan_rng(seed, epoch, WINDOW_STREAM)` (with
   `plan.longest_first`, the row group holding the longest sample goes first) and the permutation
   is cut into `ceil(tokens / window_tokens)` windows of near-equal real tokens
   (`row_group_windows`). Every row group is in exactly one window of each epoch.
2. Within a window, the plan is today's plan over the window's samples: each bucket shuffled
   (contract 1, within each bucket, within each window), cut into global batches by the
   batching (or packed into rows), the batches interleaved, each window with streams of its own
   (`orders.plan_rng`). An epoch is its windows' steps in order (`EpochPlan.window_steps`).
3. Carry: a window does not train its partial batches. The last global batch each bucket cuts
   in a window (padded), or the rows each bucket closed at the window's end and the rows short
   of a whole step (packed), go, in their order, ahead of that bucket's samples in the next
   window. The last window cuts what is left as the global plan does (`drop_remainder`, a short
   last step), so the fill stays that of the global plan. A bucket with less than a batch in a
   window carries it on again, so a row may train several windows after its own, and a window
   may train no step at all (small windows, many buckets): `EpochPlan.window_steps` keeps one
   start per window, equal starts for an empty one (`trained_windows`).

Everything is a pure function of (lengths, row groups, edges, batching, seed, epoch), not of the
world size (contract 8); one window (a corpus of at most `window_tokens`, or windows off) is the
global plan itself, hash included.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.batching import cut_global_batches
from pipeline.core.buckets import assign
from pipeline.core.config import Batching, PlanConfig
from pipeline.core.orders import WINDOW_STREAM, plan_rng, step_order, within_bucket_shuffle
from pipeline.core.packing import (
    balanced_steps,
    bucket_rows,
    interleave_rows,
    pack_epoch,
    packed_plan,
    row_cost,
)
from pipeline.core.plan import (
    PLAN_VERSION,
    EpochPlan,
    _longest_first,
    concat_ranges,
    epoch_plan,
    global_batch_sizes,
    hash_arrays,
    lengths_and_ids,
)
from pipeline.core.rows import PackingSpec, check_world_size
from pipeline.core.sections import ConfigError

__all__ = [
    "carried_rows",
    "trained_windows",
    "row_group_windows",
    "sample_windows",
    "windowed_epoch_plan",
    "windowed_pack_epoch",
]

# A window holds at least this many row groups' worth of tokens: fewer would make the shuffle
# within a window little more than the order of a few row groups.
MIN_ROW_GROUPS_PER_WINDOW = 2


def row_group_windows(
    rg_tokens: np.ndarray,
    window_tokens: int | None,
    *,
    seed: int,
    epoch: int,
    first: int | None = None,
) -> np.ndarray:
    """The window of each row group for (seed, epoch): the row groups permuted (row group
    `first` put first) and cut into windows of near-equal real tokens, about `window_tokens`
    each. All zeros (one window) when `window_tokens` is None or the corpus fits one window."""
    t = np.asarray(rg_tokens, dtype=np.int64)
    U, total = t.size, int(t.sum())
    if window_tokens is None or total <= window_tokens or U <= 1:
        return np.zeros(U, dtype=np.int64)
    biggest = int(t.max())
    if biggest * MIN_ROW_GROUPS_PER_WINDOW > window_tokens:
        raise ConfigError(
            f"plan.window_tokens={window_tokens} holds less than {MIN_ROW_GROUPS_PER_WINDOW} of "
            f"the largest row group ({biggest} real tokens, row group {int(t.argmax())}): raise "
            f"plan.window_tokens to at least {biggest * MIN_ROW_GROUPS_PER_WINDOW}, or rewrite the "
            "shards with smaller row groups (jobs.tokenize writes 1,024 rows per row group)"
        )
    perm = plan_rng(seed, epoch, WINDOW_STREAM).permutation(U)
    if first is not None:
        j = int(np.flatnonzero(perm == first)[0])
        perm[[0, j]] = perm[[j, 0]]
    n = -(-total // window_tokens)
    cum = np.cumsum(t[perm])
    # Position j is in window floor(tokens before its middle / (total / n)): near-equal tokens.
    mid = cum - t[perm] / 2.0
    w_at = np.minimum((mid * n // total).astype(np.int64), n - 1)
    w_at = np.maximum.accumulate(w_at)
    _, w_at = np.unique(w_at, return_inverse=True)  # no empty window
    out = np.empty(U, dtype=np.int64)
    out[perm] = w_at
    return out


def sample_windows(
    lengths: np.ndarray,
    row_group: np.ndarray,
    window_tokens: int | None,
    *,
    seed: int,
    epoch: int,
    longest_first: bool = True,
    num_row_groups: int | None = None,
) -> np.ndarray:
    """The window of each sample (`row_group`: its global row group, `chapters.row_group_of`)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    rg = np.asarray(row_group, dtype=np.int64)
    U = int(num_row_groups if num_row_groups is not None else (rg.max() + 1 if rg.size else 0))
    tokens = np.bincount(rg, weights=lengths, minlength=U).astype(np.int64)
    first = int(rg[int(np.argmax(lengths))]) if longest_first and lengths.size else None
    return row_group_windows(tokens, window_tokens, seed=seed, epoch=epoch, first=first)[rg]


def _pool(carry: list, own: np.ndarray, own_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions grouped by bucket, each bucket's carry ahead of its own samples; the counts."""
    starts = np.concatenate([[0], np.cumsum(own_counts)])
    parts, counts = [], np.zeros(own_counts.size, dtype=np.int64)
    for k in range(own_counts.size):
        parts += [carry[k], own[starts[k] : starts[k + 1]]]
        counts[k] = carry[k].size + own_counts[k]
    return np.concatenate(parts).astype(np.int64), counts


def _window_pools(ids, bucket, window, K, seed, epoch):
    """Per window: its own samples' positions, grouped by bucket and shuffled within each
    bucket (contract 1, with the window's streams), and their bucket counts."""
    n_win = int(window.max()) + 1 if window.size else 1
    by_window = np.argsort(window, kind="stable")
    bounds = np.searchsorted(window[by_window], np.arange(n_win + 1))
    for w in range(n_win):
        own = by_window[bounds[w] : bounds[w + 1]]
        o, counts = within_bucket_shuffle(ids[own], bucket[own], K, seed, epoch, w)
        yield w, n_win, own[o], counts


def windowed_epoch_plan(
    lengths: np.ndarray,
    edges,
    *,
    window: np.ndarray,
    epoch: int,
    world_size: int,
    batching: Batching,
    plan: PlanConfig,
    sample_ids: np.ndarray | None = None,
) -> EpochPlan:
    """A padded epoch planned window by window (module docstring); `window`: each sample's."""
    window = np.asarray(window, dtype=np.int64)
    if window.size == 0 or int(window.max()) == 0:
        return epoch_plan(
            lengths,
            edges,
            epoch=epoch,
            world_size=world_size,
            batching=batching,
            plan=plan,
            sample_ids=sample_ids,
        )
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    lengths, ids = lengths_and_ids(lengths, sample_ids)
    edges = np.asarray(edges, dtype=np.int64)
    if plan.policy != "bucketed":
        edges = edges[[0, -1]]
    K = edges.size - 1
    g = global_batch_sizes(edges, batching)
    keep_tail = batching.model_copy(update={"drop_remainder": False})
    carry = [np.zeros(0, dtype=np.int64)] * K
    flats, sizes, seqs, window_steps, dropped = [], [], [], [0], 0
    for w, n_win, own, own_counts in _window_pools(
        ids, assign(lengths, edges), window, K, plan.seed, epoch
    ):
        order, counts = _pool(carry, own, own_counts)
        last = w == n_win - 1
        cut = cut_global_batches(lengths[order], counts, edges, batching if last else keep_tail, g)
        start, size, nb = cut.start, cut.size, cut.per_bucket.copy()
        if last:
            dropped = cut.dropped
        else:  # each bucket's last batch goes ahead of its samples in the next window
            tail = (np.cumsum(nb) - 1)[nb > 0]
            carry = [np.zeros(0, dtype=np.int64)] * K
            for i in tail:
                k = int(np.searchsorted(np.cumsum(counts), start[i], side="right"))
                carry[k] = order[start[i] : start[i] + size[i]]
            keep = np.ones(start.size, dtype=bool)
            keep[tail] = False
            start, size, nb = start[keep], size[keep], nb - (nb > 0)
        seq, batch = step_order(nb, plan, epoch, w)
        bs, bz = start[batch], size[batch]
        if plan.longest_first and w == 0 and seq.size:
            _longest_first(lengths[order], seq, bs, bz)
        flats.append(order[concat_ranges(bs, bz)])
        sizes.append(bz)
        seqs.append(seq)
        window_steps.append(window_steps[-1] + seq.size)
    flat, seq = np.concatenate(flats), np.concatenate(seqs).astype(np.int64)
    step_offsets = np.concatenate([[0], np.cumsum(np.concatenate(sizes))]).astype(np.int64)
    sid, wsteps = ids[flat], np.asarray(window_steps, dtype=np.int64)
    return EpochPlan(
        seed=plan.seed,
        epoch=epoch,
        world_size=world_size,
        edges=edges,
        first_step=0,
        step_bucket=seq,
        step_offsets=step_offsets,
        sample_ids=sid,
        lengths=lengths[flat],
        content_hash=hash_arrays(
            f"bucketray-plan-v{PLAN_VERSION}-windows",
            edges,
            np.unique(wsteps),
            seq,
            step_offsets,
            sid,
        ),
        num_dropped=dropped,
        pad_to_multiple_of=batching.pad_to_multiple_of,
        window_steps=wsteps,
    )


def _carry_rows(per_bucket, spec: PackingSpec, K: int) -> tuple[list, list]:
    """(rows kept, each bucket's carried samples): each bucket's last `open_rows` rows (the ones
    its window's end closed) are carried."""
    kept, carry = [], [np.zeros(0, dtype=np.int64)] * K
    for k, members, sizes in per_bucket:
        n_keep = max(0, sizes.size - spec.open_rows)
        cut = int(sizes[:n_keep].sum())
        carry[k] = members[cut:]
        if n_keep:
            kept.append((k, members[:cut], sizes[:n_keep]))
    return kept, carry


def windowed_pack_epoch(
    lengths: np.ndarray,
    edges,
    *,
    window: np.ndarray,
    seed: int,
    epoch: int,
    world_size: int,
    spec: PackingSpec,
    sample_ids: np.ndarray | None = None,
    pad_to_multiple_of: int = 8,
) -> EpochPlan:
    """A packed epoch planned window by window (module docstring); `window`: each sample's."""
    window = np.asarray(window, dtype=np.int64)
    kw = dict(seed=seed, epoch=epoch, world_size=world_size, spec=spec)
    if window.size == 0 or int(window.max()) == 0:
        return pack_epoch(
            lengths, edges, **kw, sample_ids=sample_ids, pad_to_multiple_of=pad_to_multiple_of
        )
    check_world_size(spec.rows_per_step, world_size)
    pack_epoch(lengths[:0], edges, **kw)  # the same refusals as one window
    lengths, ids = lengths_and_ids(lengths, sample_ids)
    edges = np.asarray(edges, dtype=np.int64)
    K, R = edges.size - 1, spec.rows_per_step
    floor = int(lengths.min())
    carry = [np.zeros(0, dtype=np.int64)] * K
    flats, row_sizes, step_sizes, row_buckets, window_steps = [], [], [], [], [0]
    bucket = assign(lengths, edges)
    for w, n_win, own, own_counts in _window_pools(ids, bucket, window, K, seed, epoch):
        order, counts = _pool(carry, own, own_counts)
        per_bucket = bucket_rows(lengths, order, counts, spec, floor)
        carry = [np.zeros(0, dtype=np.int64)] * K
        if w < n_win - 1:
            per_bucket, carry = _carry_rows(per_bucket, spec, K)
        flat, row_size, row_bucket = interleave_rows(per_bucket, K, seed, epoch, w)
        short = row_size.size % R if w < n_win - 1 else 0
        if short:  # rows short of a whole step go ahead of their buckets in the next window
            keep_samples = int(row_size[:-short].sum())
            tail = flat[keep_samples:]
            for k in np.unique(bucket[tail]):
                carry[k] = np.concatenate([carry[k], tail[bucket[tail] == k]])
            flat, row_size, row_bucket = flat[:keep_samples], row_size[:-short], row_bucket[:-short]
        order_rows, step_size = balanced_steps(
            row_cost(lengths, flat, row_size, spec),
            spec,
            seed,
            epoch,
            w,
            spec.longest_first and w == 0,
        )
        offs = np.concatenate([[0], np.cumsum(row_size)]).astype(np.int64)
        flats.append(flat[concat_ranges(offs[:-1][order_rows], row_size[order_rows])])
        row_sizes.append(row_size[order_rows])
        row_buckets.append(row_bucket[order_rows])
        step_sizes.append(step_size)
        window_steps.append(window_steps[-1] + step_size.size)
    return packed_plan(
        np.concatenate(flats),
        np.concatenate(row_sizes),
        np.concatenate(row_buckets).astype(np.int64),
        np.concatenate(step_sizes),
        ids=ids,
        lengths=lengths,
        edges=edges,
        pad_to_multiple_of=pad_to_multiple_of,
        window_steps=np.asarray(window_steps, dtype=np.int64),
        **kw,
    )


def trained_windows(plan: EpochPlan, steps: np.ndarray | None = None) -> np.ndarray:
    """The window training each of `steps` (absolute; default: each of the plan's rows' step).
    An empty window's start equals the next one's, so no step falls in it."""
    if steps is None:
        steps = np.repeat(np.arange(plan.num_steps), np.diff(plan.step_offsets)) + plan.first_step
    return np.searchsorted(plan.window_steps, steps, side="right") - 1


def carried_rows(
    plan: EpochPlan, read_window: np.ndarray, trained: np.ndarray | None = None
) -> np.ndarray:
    """Which of the plan's rows (aligned with `plan.sample_ids`) a later window trains than the
    one that reads them: `read_window` is each planned row's window (its row group's; `trained`,
    each row's `trained_windows` where the caller has them). Every other row is trained in the
    window that reads it, so an epoch that reads each window's row groups once and holds these
    rows until they train reads each row group once."""
    read_window = np.asarray(read_window, dtype=np.int64)
    if plan.window_steps is None:
        return np.zeros(read_window.size, dtype=bool)
    trained = trained_windows(plan) if trained is None else trained
    if (trained < read_window).any():
        raise AssertionError("a windowed plan trains a row before its window")
    return read_window != trained
