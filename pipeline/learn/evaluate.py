"""Forward passes over held-out micro-batches on one rank: per-document sums, no side effects.

Each micro-batch is what training collates (pipeline.data.rechunk): padded rows of one sample,
or packed rows whose `attention_mask` holds each token's document number. Every document's
token-loss sum, correct top-1 predictions and supervised tokens are computed in fp32 from the
logits (in chunks, as the training loss is) and added up into `EvalSums` by the training bucket
of its length, and by its length range where the run has ranges
(`pipeline.core.evaluation.EvalSums`, by `pipeline.train.evaluation`). The model
runs in eval mode under `no_grad`, and the torch RNG state is restored
afterwards, so a run with evaluation trains exactly what the same run without it trains.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.core.collate import IGNORE_INDEX
from pipeline.learn.loss import LOSS_CHUNK_TOKENS

__all__ = ["document_sums", "no_side_effects"]


def document_sums(
    logits: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    chunk_tokens: int = LOSS_CHUNK_TOKENS,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per document of a [B, L] micro-batch, in sample order: (token-loss sum, correct top-1
    predictions, supervised tokens, length). A row holds one document (padded: a 0/1 mask) or
    several (packed: the mask numbers them 1, 2, ... within the row)."""
    B, L = labels.shape
    if B == 0 or L == 0:
        z = np.zeros(0)
        return z, z, z, z
    mask = attention_mask.to(torch.int64)
    per_row = mask.amax(dim=1).clamp_min(1)
    before = torch.cumsum(per_row, 0) - per_row
    doc = before[:, None] + mask - 1  # each token's document index (valid where mask > 0)
    D = int(per_row.sum())
    length = torch.bincount(doc[mask > 0], minlength=D)
    # Position t predicts labels[t + 1], which belongs to the document of token t + 1.
    target = torch.full_like(labels, IGNORE_INDEX)
    target[:, :-1] = labels[:, 1:]
    tdoc = torch.zeros_like(doc)
    tdoc[:, :-1] = doc[:, 1:]
    V = logits.shape[-1]
    flat, flat_t, flat_d = logits.reshape(-1, V), target.reshape(-1), tdoc.reshape(-1)
    loss = torch.zeros(D, dtype=torch.float64, device=logits.device)
    correct = torch.zeros(D, dtype=torch.float64, device=logits.device)
    tokens = torch.zeros(D, dtype=torch.float64, device=logits.device)
    for i in range(0, flat_t.numel(), chunk_tokens):
        t = flat_t[i : i + chunk_tokens]
        keep = t != IGNORE_INDEX
        if not bool(keep.any()):
            continue
        lg, t, d = (
            flat[i : i + chunk_tokens][keep].float(),
            t[keep],
            flat_d[i : i + chunk_tokens][keep],
        )
        ce = F.cross_entropy(lg, t, reduction="none").double()
        loss.index_add_(0, d, ce)
        correct.index_add_(0, d, (lg.argmax(-1) == t).double())
        tokens.index_add_(0, d, torch.ones_like(ce))
    return (
        loss.cpu().numpy(),
        correct.cpu().numpy(),
        tokens.cpu().numpy(),
        length.cpu().numpy(),
    )


@contextlib.contextmanager
def no_side_effects(model: torch.nn.Module, device: torch.device):
    """Eval mode and no gradients inside; the model's mode and every torch RNG stream of
    `device` (and the CPU's) restored after."""
    was_training = model.training
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, enabled=True), torch.no_grad():
        model.eval()
        try:
            yield
        finally:
            model.train(was_training)
