"""Vectorized collation: ragged token rows (flat values + offsets) to padded arrays, row gathers."""

from __future__ import annotations

import numpy as np

__all__ = ["IGNORE_INDEX", "labels_from_mask", "padded_length", "collate"]

# PyTorch's cross_entropy ignore_index default; HF uses the same value for unsupervised tokens.
IGNORE_INDEX = -100


def labels_from_mask(values: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """Labels from token ids and a loss mask of the same layout: the token where the mask is
    nonzero, IGNORE_INDEX elsewhere (the one loss_mask -> labels rule)."""
    return np.where(np.asarray(loss_mask) != 0, values, IGNORE_INDEX)


def padded_length(max_len, upper, multiple: int):
    """The padded length of a batch whose longest row has `max_len` tokens: rounded up to
    `multiple`, never beyond its bucket's upper edge `upper` (contract 2; None: no edge, for
    batches made without buckets). The one home of this rule: what collate pads to, what the
    greedy cut budgets for (pipeline.core.batching) and what the padding metrics count
    (pipeline.core.metrics). Integers give an int; arrays work element-wise (int64). A batch
    longer than its edge is a ValueError."""
    if isinstance(max_len, int | np.integer) and isinstance(upper, int | np.integer):
        # One batch (collate's call, once per micro-batch): plain ints, no array overhead.
        if max_len > upper:
            raise ValueError(f"batch max length {max_len} exceeds its bucket's upper edge {upper}")
        return int(min(_round_up(max_len, multiple), upper))
    max_len = np.asarray(max_len, dtype=np.int64)
    if upper is None:
        return _round_up(max_len, multiple)
    over = max_len > upper
    if over.any():
        i = np.flatnonzero(over.ravel())[0]
        edge = np.broadcast_to(upper, max_len.shape).ravel()[i]
        raise ValueError(
            f"batch max length {max_len.ravel()[i]} exceeds its bucket's upper edge {edge}"
        )
    return np.minimum(_round_up(max_len, multiple), upper)


def _round_up(n, multiple: int):
    return -(-n // multiple) * multiple


def _windows(a: np.ndarray, width: int) -> np.ndarray:
    """Every `width`-long window of the contiguous 1-D array `a` as one view: row i is
    a[i : i + width] (rows overlap, nothing is copied; only ever read)."""
    step = a.itemsize
    return np.ndarray((a.size - width + 1, width), a.dtype, a, 0, (step, step))


def _rows(flat: np.ndarray, n: int, starts: np.ndarray, L: int) -> np.ndarray:
    """[B, L] int64 array, row b = the L tokens from starts[b] on: `flat` (n tokens, cast to int64
    by assignment, which broadcasts like any assignment) then L zeros, gathered through its
    windows. The columns past a row's own end hold the next rows' tokens: the caller pads them."""
    ext = np.empty(n + L, dtype=np.int64)
    ext[:n] = flat
    ext[n:] = 0
    return _windows(ext, L)[starts]


def collate(
    values: np.ndarray,
    offsets: np.ndarray,
    *,
    upper: int,
    pad_to_multiple_of: int = 8,
    pad_id: int = 0,
    loss_mask: np.ndarray | None = None,
    labels: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Pad B ragged rows into [B, L] int64 arrays.

    `values` holds the rows' token ids back to back, `offsets` their B+1 boundaries
    (non-decreasing, else ValueError). `loss_mask` (same layout, nonzero = supervised) or `labels`
    (same layout, IGNORE_INDEX = unsupervised) choose the supervised tokens; without either every
    real token is supervised. Labels are aligned with input_ids (the loss shifts them). An empty
    batch (B = 0) gives [0, 0] arrays.

    Each row is copied as a whole L-token window of the flat tokens (one gather of B rows from
    the flat array's overlapping windows: no per-token index arrays), labels likewise (a copy of
    input_ids without supervision), position_ids as 0..L-1 in every row; then only the padding
    (columns lens[b]..L-1, all right of the shortest row's end) is overwritten, through one
    boolean mask over those columns. The attention mask is gathered the same way from a
    [1]*L + [0]*L template. The work is memory-bound (32 bytes written per padded token), so few
    full-size passes and temporaries is what matters.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    lens = np.diff(offsets)
    B = lens.size
    shortest, longest = (int(lens.min()), int(lens.max())) if B else (0, 0)
    L = padded_length(longest, upper, pad_to_multiple_of) if longest > 0 else 0
    if shortest < 0:
        raise ValueError(f"offsets must be non-decreasing (a row has length {shortest})")
    lo, hi = int(offsets[0]), int(offsets[-1])
    n = hi - lo
    starts = offsets[:-1] - lo
    vals = np.asarray(values)[lo:hi]
    input_ids = _rows(vals, n, starts, L)
    if labels is not None:
        out_labels = _rows(np.asarray(labels)[lo:hi], n, starts, L)
    elif loss_mask is not None:
        out_labels = _rows(labels_from_mask(vals, np.asarray(loss_mask)[lo:hi]), n, starts, L)
    else:
        out_labels = input_ids.copy()
    position_ids = np.empty((B, L), dtype=np.int64)
    position_ids[:] = np.arange(L, dtype=np.int64)
    # pad[b, j] = (shortest + j >= lens[b]): windows of [False]*L + [True]*(L - shortest)
    edge = np.zeros(2 * L - shortest, dtype=bool)
    edge[L:] = True
    pad = _windows(edge, L - shortest)[L - lens + shortest]
    for out, fill in ((input_ids, pad_id), (out_labels, IGNORE_INDEX), (position_ids, 0)):
        np.copyto(out[:, shortest:], fill, casting="unsafe", where=pad)
    ones = np.zeros(2 * L, dtype=np.int64)
    ones[:L] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": _windows(ones, L)[L - lens],
        "labels": out_labels,
        "position_ids": position_ids,
        "num_real_tokens": np.int64(hi - lo),
        "num_padded_tokens": np.int64(B * L),
    }
