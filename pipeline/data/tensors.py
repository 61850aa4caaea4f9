"""A micro-batch as the model's input tensors, and what an empty one becomes.

A rank's share of a small bucket's last global step can be empty (B = 0). The rank must still
run forward and backward, or DDP's gradient all-reduce would wait for it forever (contracts 3
and 4): an empty micro-batch becomes a 1 x 2 placeholder batch whose labels are all ignored, so
its loss weight is zero while it touches every parameter. One rule for `jobs.train`'s step
(`pipeline.train.step`) and for your own loop (`pipeline.data.api.batch_tensors`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.core.collate import IGNORE_INDEX

if TYPE_CHECKING:
    import torch

    from pipeline.data.rechunk import MicroBatch

__all__ = ["INPUT_NAMES", "batch_tensors", "empty_batch"]

# The tensors a micro-batch hands the model and the loss, int64 [B, L] each (packed rows: the
# attention mask holds each token's document number, int32).
INPUT_NAMES = ("input_ids", "attention_mask", "position_ids", "labels")


def empty_batch(device=None) -> dict[str, torch.Tensor]:
    """The placeholder of an empty micro-batch: one row of two tokens, the first attended, no
    supervised token."""
    import torch

    z = torch.zeros(1, 2, dtype=torch.int64, device=device)
    mask = z.clone()
    mask[0, 0] = 1  # filled in place: torch.tensor(..., device=) would wait for its copy
    return {
        "input_ids": z,
        "attention_mask": mask,
        "position_ids": z,
        "labels": torch.full_like(z, IGNORE_INDEX),
    }


def batch_tensors(mb: MicroBatch, device=None) -> dict[str, torch.Tensor]:
    """The micro-batch's tensors on `device` (None: where they are): input_ids, attention_mask,
    position_ids, labels (int64 [B, L]; with batching.mode=packed, B rows of row_tokens whose
    attention_mask holds each token's document number as int32, 0 on padding, and positions
    restart per document: the model must attend within documents,
    pipeline/learn/packed_attention.py). An empty micro-batch becomes `empty_batch`: 1 x 2, its
    labels all -100."""
    if mb.input_ids.numel() == 0:
        return empty_batch(device)
    t = {n: getattr(mb, n) for n in INPUT_NAMES}
    if device is None:
        return t
    return {k: v.to(device, non_blocking=True) for k, v in t.items()}
