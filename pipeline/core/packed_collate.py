"""Vectorized collation of packed rows: whole samples back to back, document ids, positions.

A packed micro-batch is B rows; row b holds consecutive samples of the flat token stream, back to
back, then padding up to `row_tokens`. The model sees the forward signature's three arrays with
one extension of `attention_mask` (pipeline.learn.factory): it holds each token's DOCUMENT NUMBER
within its row (1, 2, ...; 0 = padding), so a padded batch's 0/1 mask is the special case of one
document per row. `position_ids` restart at 0 with every document. The label of each document's
first token is IGNORE_INDEX: the loss predicts labels[t + 1] from position t (pipeline.learn.loss),
so the last token of one document is never asked to predict the first of the next -- the same
rule as a padded row, whose first column never carries a loss.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.collate import IGNORE_INDEX, _rows, labels_from_mask

__all__ = ["collate_packed"]


def collate_packed(
    values: np.ndarray,
    offsets: np.ndarray,
    row_offsets: np.ndarray,
    *,
    row_tokens: int,
    pad_id: int = 0,
    loss_mask: np.ndarray | None = None,
    labels: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """[B, row_tokens] int64 arrays for B packed rows.

    `values`/`offsets`: the micro-batch's samples back to back (as for `collate`); `row_offsets`:
    B+1 boundaries, in samples, of each row. `loss_mask` or `labels` (same layout) choose the
    supervised tokens as in `collate`. Every array is one gather of row windows from the flat
    stream plus one masked fill of the padding: no loop over tokens, samples or rows.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    row_offsets = np.asarray(row_offsets, dtype=np.int64)
    B, T = row_offsets.size - 1, int(row_tokens)
    doc_lens = np.diff(offsets)
    if (doc_lens < 0).any():
        raise ValueError("offsets must be non-decreasing")
    lo, hi = int(offsets[0]), int(offsets[-1])
    n = hi - lo
    tok = offsets - lo  # document boundaries in the micro-batch's tokens
    row_start = tok[row_offsets[:-1] - row_offsets[0]]
    row_len = tok[row_offsets[1:] - row_offsets[0]] - row_start
    if B and int(row_len.max()) > T:
        raise ValueError(f"a row holds {int(row_len.max())} tokens, more than row_tokens={T}")
    if B == 0:
        empty = np.zeros((0, 0), dtype=np.int64)
        return {
            "input_ids": empty,
            "attention_mask": empty.astype(np.int32),
            "labels": empty,
            "position_ids": empty,
            "num_real_tokens": np.int64(0),
            "num_padded_tokens": np.int64(0),
            "num_documents": np.int64(0),
        }
    vals = np.asarray(values)[lo:hi]
    if labels is not None:
        flat_labels = np.array(np.asarray(labels)[lo:hi], dtype=np.int64)
    elif loss_mask is not None:
        flat_labels = labels_from_mask(vals, np.asarray(loss_mask)[lo:hi]).astype(np.int64)
    else:
        flat_labels = vals.astype(np.int64)
    flat_labels[tok[:-1][doc_lens > 0]] = IGNORE_INDEX  # no prediction across a boundary
    # Per token: its position within its document and its document's number within its row.
    docs_per_row = np.diff(row_offsets)
    doc_number = np.arange(doc_lens.size) - np.repeat(
        row_offsets[:-1] - row_offsets[0], docs_per_row
    )
    flat_doc = np.repeat(doc_number + 1, doc_lens)
    flat_pos = np.arange(n, dtype=np.int64) - np.repeat(tok[:-1], doc_lens)
    pad = np.arange(T)[None, :] >= row_len[:, None]
    out = {}
    for name, flat, fill in (
        ("input_ids", vals, pad_id),
        ("attention_mask", flat_doc, 0),
        ("labels", flat_labels, IGNORE_INDEX),
        ("position_ids", flat_pos, 0),
    ):
        a = _rows(flat, n, row_start, T)
        np.copyto(a, fill, casting="unsafe", where=pad)
        out[name] = a
    # int32: the dtype that tells a model the batch is packed (pipeline.learn.packed_attention).
    out["attention_mask"] = out["attention_mask"].astype(np.int32)
    out["num_real_tokens"] = np.int64(n)
    out["num_padded_tokens"] = np.int64(B * T)
    out["num_documents"] = np.int64(doc_lens.size)
    return out
