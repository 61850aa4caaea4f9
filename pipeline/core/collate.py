"""Vectorized collation: ragged token rows (flat values + offsets) to padded arrays, one scatter."""

from __future__ import annotations

import numpy as np

__all__ = ["IGNORE_INDEX", "labels_from_mask", "padded_length", "collate"]

# PyTorch's cross_entropy ignore_index default; HF uses the same value for unsupervised tokens.
IGNORE_INDEX = -100


def labels_from_mask(values: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """Labels from token ids and a loss mask of the same layout: the token where the mask is
    nonzero, IGNORE_INDEX elsewhere (the one loss_mask -> labels rule)."""
    return np.where(np.asarray(loss_mask) != 0, values, IGNORE_INDEX)


def padded_length(max_len: int, upper: int, multiple: int) -> int:
    """Batch max rounded up to `multiple`, never beyond the bucket's upper edge (contract 2)."""
    if max_len > upper:
        raise ValueError(f"batch max length {max_len} exceeds its bucket's upper edge {upper}")
    return int(min(-(-max_len // multiple) * multiple, upper))


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

    `values` holds the rows' token ids back to back, `offsets` their B+1 boundaries. `loss_mask`
    (same layout, nonzero = supervised) or `labels` (same layout, IGNORE_INDEX = unsupervised)
    choose the supervised tokens; without either every real token is supervised. Labels are
    aligned with input_ids (the loss shifts them). An empty batch (B = 0) gives [0, 0] arrays.

    One [B, L] boolean mask built by broadcasting and one masked scatter per output, in row-major
    order: no per-token index arrays (the work is memory-bound: 32 bytes written per padded
    token, so fewer full-size temporaries is what matters).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    lens = np.diff(offsets)
    B = lens.size
    L = padded_length(int(lens.max()), upper, pad_to_multiple_of) if B and lens.max() > 0 else 0
    lo, hi = int(offsets[0]), int(offsets[-1])
    vals = np.asarray(values)[lo:hi]
    ar = np.arange(L, dtype=np.int64)
    mask = ar < lens[:, None]
    input_ids = np.full((B, L), pad_id, dtype=np.int64)
    input_ids[mask] = vals
    out_labels = np.full((B, L), IGNORE_INDEX, dtype=np.int64)
    if labels is not None:
        out_labels[mask] = np.asarray(labels)[lo:hi]
    elif loss_mask is not None:
        out_labels[mask] = labels_from_mask(vals, np.asarray(loss_mask)[lo:hi])
    else:
        out_labels[mask] = vals
    return {
        "input_ids": input_ids,
        "attention_mask": mask.astype(np.int64),
        "labels": out_labels,
        "position_ids": np.multiply(ar, mask, dtype=np.int64),
        "num_real_tokens": np.int64(hi - lo),
        "num_padded_tokens": np.int64(B * L),
    }
