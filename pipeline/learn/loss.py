"""Honest loss (contract 9): token sums per rank, normalised by the all-reduced token count.

Labels are aligned with input_ids (collate), so position t predicts labels[t + 1]. Each rank
returns the *sum* of its token losses; the loop divides by the number of supervised tokens of the
whole global step (all ranks, all accumulated micro-batches), so a small remainder batch weighs
what its tokens weigh, not what a full batch weighs.

Memory: the cross-entropy runs in chunks of `LOSS_CHUNK_TOKENS` positions, each upcast to fp32,
so at most one chunk's fp32 logits exist at a time (forward or backward) instead of a [tokens,
vocab] fp32 copy of the whole micro-batch. Nothing is kept from the forward; the backward
recomputes each chunk's fp32 cross-entropy and writes its gradient into one [tokens, vocab]
gradient in the logits' dtype (`_ChunkedCrossEntropy`): sliced autograd would zero-fill a
full-size gradient per chunk and add them up.

A non-finite loss or gradient norm never reaches the weights: `NonFiniteGuard` skips the update
and stops the run with `NonFiniteLossError` after `train.max_nonfinite_steps` such steps in a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.core.collate import IGNORE_INDEX

__all__ = [
    "LOSS_CHUNK_TOKENS",
    "NonFiniteLossError",
    "NonFiniteGuard",
    "assert_finite_weights",
    "supervised_tokens",
    "token_sums",
    "ddp_loss_scale",
]

# Positions per cross-entropy chunk: 8192 x a 128K vocab in fp32 is 4 GiB, so keep it modest.
LOSS_CHUNK_TOKENS = 4096


class NonFiniteLossError(RuntimeError):
    """The loss, gradient norm or weights became NaN/inf. Not retryable: a restart from the last
    checkpoint replays the same batches and fails the same way; lower train.lr or fix the data."""

    retryable = False  # the driver's failure policy stops at the first such error


def supervised_tokens(labels: torch.Tensor) -> int:
    """Tokens that carry a loss once labels are shifted (the first column never does)."""
    return int((labels[:, 1:] != IGNORE_INDEX).sum()) if labels.numel() else 0


def _chunk_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), target, ignore_index=IGNORE_INDEX, reduction="sum")


def _chunk_losses(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), target, ignore_index=IGNORE_INDEX, reduction="none")


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Sum of the fp32 cross-entropy of `flat` [N, V] against `target` [N], `chunk` rows at a
    time. The backward runs each chunk's cross-entropy backward again (the same kernels as the
    unchunked loss, so the same gradient per row) and copies it into its rows of a single
    gradient: one [N, V] allocation, never one per chunk."""

    @staticmethod
    def forward(ctx, flat, target, chunk: int, per_token: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(flat, target)
        ctx.chunk = chunk
        total = torch.zeros((), dtype=torch.float32, device=flat.device)
        for i in range(0, flat.shape[0], chunk):
            if per_token is None:
                total += _chunk_loss(flat[i : i + chunk], target[i : i + chunk])
            else:  # each position's loss kept (0 where unsupervised), their sum the chunk's
                ce = _chunk_losses(flat[i : i + chunk], target[i : i + chunk])
                per_token[i : i + chunk] = ce
                total += ce.sum()
        return total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        flat, target = ctx.saved_tensors
        grad = torch.empty_like(flat)
        for i in range(0, flat.shape[0], ctx.chunk):
            x = flat[i : i + ctx.chunk].detach().requires_grad_()
            with torch.enable_grad():
                loss = _chunk_loss(x, target[i : i + ctx.chunk])
            # The upcast's backward casts the fp32 gradient to the logits' dtype, as unchunked.
            (g,) = torch.autograd.grad(loss, x, grad_out)
            grad[i : i + ctx.chunk].copy_(g)
            del g, loss, x
        return grad, None, None, None


def token_sums(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_tokens: int = LOSS_CHUNK_TOKENS,
    per_token: bool = False,
) -> tuple[torch.Tensor, ...]:
    """(sum of next-token cross-entropy, number of correct top-1 predictions) over supervised
    tokens. Both are 0 for a batch without supervised tokens, and the loss stays attached to the
    graph so backward still reaches every parameter. `per_token`: a third tensor, each
    position's fp32 loss [B*L] without gradient (0 where unsupervised), from the same forward.

    The targets are the labels shifted left with IGNORE_INDEX in the last column, so the logits
    are used as one [B*L, V] view (no copy). Above `chunk_tokens` positions, each chunk's fp32
    cross-entropy is recomputed in backward rather than kept (`_ChunkedCrossEntropy`)."""
    V = logits.shape[-1]
    target = torch.full_like(labels, IGNORE_INDEX)
    target[:, :-1] = labels[:, 1:]
    flat, flat_t = logits.reshape(-1, V), target.reshape(-1)
    n = flat_t.numel()
    losses = None
    if n <= chunk_tokens and per_token:
        ce = _chunk_losses(flat, flat_t)
        loss_sum, losses = ce.sum(), ce.detach()
    elif n <= chunk_tokens:
        loss_sum = _chunk_loss(flat, flat_t)
    else:
        losses = flat.new_zeros(n, dtype=torch.float32) if per_token else None
        loss_sum = _ChunkedCrossEntropy.apply(flat, flat_t, chunk_tokens, losses)
    with torch.no_grad():
        # bf16 -> fp32 is exact, so the argmax of the low-precision logits is the same.
        correct = ((flat.argmax(-1) == flat_t) & (flat_t != IGNORE_INDEX)).sum()
    return (loss_sum, correct, losses) if per_token else (loss_sum, correct)


def ddp_loss_scale(global_tokens: int, world_size: int) -> float:
    """Factor turning a rank's token-loss sum into the tensor to backpropagate.

    DDP averages gradients over ranks; multiplying by world_size undoes that average, so the
    update is the gradient of (sum over all ranks' token losses) / (all supervised tokens).
    """
    return world_size / max(global_tokens, 1)


class NonFiniteGuard:
    """Decides, per optimizer step, whether the update may be applied.

    Its inputs are the same on every rank (the all-reduced loss sums, the DDP-synchronised
    gradient norm), so every rank takes the same decision. A non-finite step is skipped; after
    `max_consecutive` skipped steps in a row the next one raises NonFiniteLossError naming the
    global step, its bucket and a few of this rank's sample ids. `streak > 0` means the weights
    may already be poisoned, so the trainer writes no checkpoint then.
    """

    def __init__(self, max_consecutive: int = 0):
        self.max_consecutive = max_consecutive
        self.streak = 0

    def check(
        self,
        *,
        step_losses: Sequence[float],
        grad_norm: float,
        steps: Sequence[int],
        buckets: Sequence[int],
        sample_ids: Sequence[np.ndarray],
        epoch: int = 0,
        rank: int = 0,
    ) -> bool:
        """True: apply the update. False: skip it. Raises after too many non-finite steps."""
        bad = [i for i, x in enumerate(step_losses) if not math.isfinite(x)]
        if not bad and math.isfinite(grad_norm):
            self.streak = 0
            return True
        self.streak += 1
        if self.streak > self.max_consecutive:
            i = bad[0] if bad else len(steps) - 1
            what = f"loss {step_losses[i]}" if bad else f"gradient norm {grad_norm}"
            ids = [int(x) for x in np.asarray(sample_ids[i])[:8]]
            raise NonFiniteLossError(
                f"non-finite {what} at epoch {epoch} step {steps[i]} (bucket {buckets[i]}; rank "
                f"{rank}'s sample ids {ids}), {self.streak} non-finite step(s) in a row with "
                f"train.max_nonfinite_steps={self.max_consecutive}: the run stops without "
                "writing a checkpoint; lower train.lr or check those samples"
            )
        return False


def assert_finite_weights(state_dict: dict) -> None:
    """Raise NonFiniteLossError if any floating tensor of a model state dict is NaN/inf."""
    bad = [
        k
        for k, t in state_dict.items()
        if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if bad:
        raise NonFiniteLossError(
            f"refusing to write a checkpoint: non-finite values in {len(bad)} weight tensor(s) "
            f"({', '.join(bad[:3])}); lower train.lr or check the data"
        )
