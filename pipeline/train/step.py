"""Forward and backward of one optimizer step's micro-batches on one rank (no Ray).

Every rank receives one micro-batch per global step, all from the same bucket; `train.grad_accum`
global steps make one optimizer step. The loss of a group is the sum of token losses over all
ranks divided by the all-reduced number of supervised tokens (contract 9). A rank whose
micro-batch is empty still runs forward and backward, on the placeholder batch whose loss weight
is zero (`pipeline.data.tensors.empty_batch`), so it joins every DDP collective (contracts 3 and 4).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from pipeline.data.tensors import batch_tensors
from pipeline.learn.loss import ddp_loss_scale, supervised_tokens, token_sums

__all__ = ["GroupStats", "all_reduce", "train_group"]


@dataclass
class GroupStats:
    """One optimizer step's worth of global steps; every array is summed over all ranks."""

    steps: list[int]
    buckets: list[int]
    loss_sum: np.ndarray
    correct: np.ndarray
    tokens: np.ndarray  # supervised tokens
    real: np.ndarray  # real (unpadded) tokens
    padded: np.ndarray  # padded slots
    samples: np.ndarray
    sample_ids: list[np.ndarray] = field(default_factory=list)  # this rank's, per step

    def step_loss(self, i: int) -> float:
        return float(self.loss_sum[i] / max(self.tokens[i], 1))

    def bucket_losses(self) -> dict[int, float]:
        """Loss of each bucket trained in this group: its steps' token sums over their tokens."""
        b = np.asarray(self.buckets)
        return {
            int(k): float(self.loss_sum[b == k].sum() / max(self.tokens[b == k].sum(), 1))
            for k in np.unique(b)
        }


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks in place (a no-op without a process group)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t


def train_group(
    model: nn.Module,
    group: list,
    *,
    device: torch.device,
    world_size: int,
    bf16: bool = False,
) -> GroupStats:
    """Forward and backward over this rank's micro-batches of `group` (one per global step);
    gradients accumulate in `model`, normalised over every supervised token of the group on all
    ranks. The caller steps the optimizer."""
    n = len(group)
    local_tokens = torch.tensor([supervised_tokens(mb.labels) for mb in group], dtype=torch.float64)
    global_tokens = all_reduce(local_tokens.to(device)).cpu()
    scale = ddp_loss_scale(int(global_tokens.sum()), world_size)
    sums = []
    for i, mb in enumerate(group):
        x = batch_tensors(mb, device)
        # Only the last micro-step of the group all-reduces gradients.
        sync = i == n - 1 or not isinstance(model, DistributedDataParallel)
        with contextlib.nullcontext() if sync else model.no_sync():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(x["input_ids"], x["attention_mask"], x["position_ids"])
            loss_sum, correct = token_sums(logits, x["labels"])
            (loss_sum * scale).backward()
        sums.append(torch.stack([loss_sum.detach().double(), correct.double()]))
    local = torch.zeros(n, 5, dtype=torch.float64, device=device)
    local[:, :2] = torch.stack(sums)
    local[:, 2] = torch.tensor([mb.num_real_tokens for mb in group], dtype=torch.float64)
    local[:, 3] = torch.tensor([mb.num_padded_tokens for mb in group], dtype=torch.float64)
    local[:, 4] = torch.tensor([len(mb.sample_ids) for mb in group], dtype=torch.float64)
    tot = all_reduce(local).cpu().numpy()
    return GroupStats(
        steps=[int(mb.step) for mb in group],
        buckets=[int(mb.bucket) for mb in group],
        loss_sum=tot[:, 0],
        correct=tot[:, 1],
        tokens=global_tokens.numpy(),
        real=tot[:, 2],
        padded=tot[:, 3],
        samples=tot[:, 4],
        sample_ids=[np.asarray(mb.sample_ids) for mb in group],
    )
