"""The training loss of a micro-batch split by document length range, on the device, no sync.

A packed row holds several documents (its attention mask numbers them 1, 2, ... within the row,
0 on padding); a padded row holds one (a 0/1 mask). `document_stats` adds each supervised
token's fp32 cross-entropy into the length range of the document it belongs to: the target at
position t is token t + 1, so the token counts for the document of t + 1, as in the held-out
per-document sums (`pipeline.learn.evaluate.document_sums`). It also sums, per range, each
document's loss sum and token count squared and multiplied: what the step's sampling variance is
computed from. Everything stays on the device and nothing is read back (no boolean indexing, no
`.item()`): the step adds the result to the one tensor it copies to the host per optimizer step
(`pipeline.train.step`). The per-token losses are the training forward's own
(`token_sums(..., per_token=True)`): no second cross-entropy over the logits."""

from __future__ import annotations

import torch

from pipeline.core.collate import IGNORE_INDEX

__all__ = ["document_lengths", "document_stats"]


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


def _target_groups(labels, attention_mask, bounds, groups: int):
    """Per position of the flattened [B*L] micro-batch: the target's document key (row * (L + 1)
    + the target's mask number) and its length range (`groups` where unsupervised)."""
    target = torch.full_like(labels, IGNORE_INDEX)
    target[:, :-1] = labels[:, 1:]
    m = attention_mask.to(torch.int64)
    B, L = m.shape
    length = document_lengths(m)
    tlen = torch.zeros_like(length)
    tlen[:, :-1] = length[:, 1:]
    tdoc = torch.zeros_like(m)
    tdoc[:, :-1] = m[:, 1:]
    if bounds is None or groups == 1:
        rng = torch.zeros_like(tlen)
    else:
        rng = torch.bucketize(tlen.to(torch.float64), bounds).clamp_(max=groups - 1)
    sup = target != IGNORE_INDEX
    rng = torch.where(sup, rng, torch.full_like(rng, groups))
    key = torch.arange(B, device=m.device)[:, None] * (L + 1) + tdoc
    key = torch.where(sup, key, torch.full_like(key, B * (L + 1)))  # one dropped key
    return key.reshape(-1), rng.reshape(-1), B * (L + 1)


def document_stats(
    losses: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor,
    bounds: torch.Tensor | None,
    groups: int,
) -> torch.Tensor:
    """[6, groups] float64 on the device, per length range (one group where `bounds` is None):
    the token-loss sum, the supervised tokens, the documents, and over those documents the sums
    of S_d^2, S_d * n_d and n_d^2 (S_d a document's token-loss sum, n_d its supervised tokens).
    `losses` [B*L]: each position's loss (`token_sums(..., per_token=True)`). The last three make
    the step's sampling variance (`pipeline.core.jumpiness.sampling_variance`): how much its
    loss moves with which documents it drew."""
    with torch.no_grad():
        G = int(groups)
        key, rng, K = _target_groups(labels, attention_mask, bounds, G)
        ce = losses.to(torch.float64)
        one = torch.ones_like(ce)
        S = torch.zeros(K + 1, dtype=torch.float64, device=ce.device).index_add_(0, key, ce)
        n = torch.zeros_like(S).index_add_(0, key, one)
        # A document's range (every token of it has the same); K, the dropped key, gets G.
        g = torch.full((K + 1,), G, dtype=torch.int64, device=ce.device).scatter_(0, key, rng)
        g = torch.where(n > 0, g, torch.full_like(g, G))
        out = torch.zeros(6, G + 1, dtype=torch.float64, device=ce.device)
        out[0].index_add_(0, rng, ce)
        out[1].index_add_(0, rng, one)
        for i, v in enumerate((torch.ones_like(S), S * S, S * n, n * n)):
            out[2 + i].index_add_(0, g, v)
        return out[:, :G]
