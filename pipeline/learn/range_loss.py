"""The training loss of a micro-batch split by document length range, on the device, no sync.

A packed row holds several documents (its attention mask numbers them 1, 2, ... within the row,
0 on padding); a padded row holds one (a 0/1 mask). `range_sums` adds each supervised token's
fp32 cross-entropy into the length range of the document it belongs to: the target at position t
is token t + 1, so the token counts for the document of t + 1, as in the held-out per-document
sums (`pipeline.learn.evaluate.document_sums`). Everything stays on the device and nothing is
read back (no boolean indexing, no `.item()`): the step adds the result to the one tensor it
copies to the host per optimizer step (`pipeline.train.step`). It costs one more chunked
cross-entropy forward over the logits, without gradients, after the step's backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.core.collate import IGNORE_INDEX
from pipeline.learn.loss import LOSS_CHUNK_TOKENS

__all__ = ["document_lengths", "range_sums"]


def document_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L] int64: each token's document length (0 on padding). Documents are the runs of one
    nonzero mask value within a row (packed: document numbers; padded: the row's 1s)."""
    m = attention_mask.to(torch.int64)
    B, L = m.shape
    pos = torch.arange(L, device=m.device).expand(B, L)
    prev = torch.zeros_like(m)
    prev[:, 1:] = m[:, :-1]
    nxt = torch.zeros_like(m)
    nxt[:, :-1] = m[:, 1:]
    real = m > 0
    start = real & (prev != m)
    end = real & (nxt != m)
    # Each token's document start (the last start at or before it) and end (the first end at
    # or after it): running maxima and minima along the row, no host read.
    first = torch.cummax(torch.where(start, pos, torch.zeros_like(pos)), dim=1).values
    ends = torch.where(end, pos, torch.full_like(pos, L))
    last = torch.flip(torch.cummin(torch.flip(ends, [1]), dim=1).values, [1])
    return torch.where(real, last - first + 1, torch.zeros_like(pos))


def range_sums(
    logits: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor,
    bounds: torch.Tensor,
    num_ranges: int,
    *,
    chunk_tokens: int = LOSS_CHUNK_TOKENS,
) -> torch.Tensor:
    """[2, num_ranges] float64 on the logits' device: per length range, the token-loss sum and
    the supervised tokens. `bounds` holds the ranges' inner edges (a range holds lengths in
    (e_r, e_r+1]; float64, on the device); lengths past the top edge count in the last range."""
    with torch.no_grad():
        R = int(num_ranges)
        target = torch.full_like(labels, IGNORE_INDEX)
        target[:, :-1] = labels[:, 1:]
        length = document_lengths(attention_mask)
        tlen = torch.zeros_like(length)
        tlen[:, :-1] = length[:, 1:]
        rng = torch.bucketize(tlen.to(torch.float64), bounds).clamp_(max=R - 1)
        # Unsupervised positions go to an extra bin that is dropped.
        rng = torch.where(target != IGNORE_INDEX, rng, torch.full_like(rng, R))
        V = logits.shape[-1]
        flat, flat_t, flat_r = logits.reshape(-1, V), target.reshape(-1), rng.reshape(-1)
        loss = torch.zeros(R + 1, dtype=torch.float64, device=logits.device)
        tokens = torch.zeros(R + 1, dtype=torch.float64, device=logits.device)
        for i in range(0, flat_t.numel(), chunk_tokens):
            t, r = flat_t[i : i + chunk_tokens], flat_r[i : i + chunk_tokens]
            ce = F.cross_entropy(
                flat[i : i + chunk_tokens].float(), t, ignore_index=IGNORE_INDEX, reduction="none"
            )
            loss.index_add_(0, r, ce.double())
            tokens.index_add_(0, r, torch.ones_like(ce, dtype=torch.float64))
        return torch.stack([loss[:R], tokens[:R]])
