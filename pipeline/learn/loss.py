"""Honest loss (contract 9): token sums per rank, normalised by the all-reduced token count.

Labels are aligned with input_ids (collate), so position t predicts labels[t + 1]. Each rank
returns the *sum* of its token losses; the loop divides by the number of supervised tokens of the
whole global step (all ranks, all accumulated micro-batches), so a small remainder batch weighs
what its tokens weigh, not what a full batch weighs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.core.collate import IGNORE_INDEX

__all__ = ["supervised_tokens", "token_sums", "ddp_loss_scale"]


def supervised_tokens(labels: torch.Tensor) -> int:
    """Tokens that carry a loss once labels are shifted (the first column never does)."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum()) if labels.numel() else 0


def token_sums(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token cross-entropy, number of correct top-1 predictions) over supervised
    tokens. Both are 0 for a batch without supervised tokens, and the loss stays attached to the
    graph so backward still reaches every parameter."""
    logits = logits[:, :-1].float()
    target = labels[:, 1:]
    loss_sum = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        target.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    with torch.no_grad():
        correct = ((logits.argmax(-1) == target) & (target != IGNORE_INDEX)).sum()
    return loss_sum, correct


def ddp_loss_scale(global_tokens: int, world_size: int) -> float:
    """Factor turning a rank's token-loss sum into the tensor to backpropagate.

    DDP averages gradients over ranks; multiplying by world_size undoes that average, so the
    update is the gradient of (sum over all ranks' token losses) / (all supervised tokens).
    """
    return world_size / max(global_tokens, 1)
