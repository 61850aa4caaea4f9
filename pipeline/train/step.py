"""Forward and backward of one optimizer step's micro-batches on one rank (no Ray).

Every rank receives one micro-batch per global step, all from the same bucket; `train.grad_accum`
global steps make one optimizer step. The loss of a group is the sum of token losses over all
ranks divided by the all-reduced number of supervised tokens (contract 9). A rank whose
micro-batch is empty still runs forward and backward, on the placeholder batch whose loss weight
is zero (`pipeline.data.tensors.empty_batch`), so it joins every DDP collective (contracts 3 and 4).

One host-device synchronisation per optimizer step: the token count stays on the device and the
loss is scaled by a device tensor; after backward the gradient norm is computed (and the gradient
clipped) on the device; the step's sums, the caller's host numbers (the stop flags) and the norm
travel in one tensor through one all-reduce and one copy to the host, from which the caller
decides the update and the stop. Nothing else in here reads a device value on the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from pipeline.core.collate import IGNORE_INDEX
from pipeline.core.jumpiness import sampling_variance
from pipeline.data.tensors import batch_tensors
from pipeline.learn.loss import token_sums
from pipeline.learn.packed_attention import attach_documents
from pipeline.learn.range_loss import document_stats

__all__ = ["GroupStats", "all_reduce", "device_inputs", "train_group"]

# Columns summed over ranks per micro-batch: loss sum, correct, real tokens, padded, samples.
_SUMMED = 5


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
    grad_norm: float = float("nan")  # of the global gradient, before clipping (when asked)
    extra: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the host numbers, summed
    # Per step and length range (`ranges` given): token-loss sums and supervised tokens.
    range_loss: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    range_tokens: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    # Per step: the variance of its loss that comes from which documents it drew, within each
    # length range (`pipeline.core.jumpiness.sampling_variance`).
    noise: np.ndarray = field(default_factory=lambda: np.zeros(0))

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


def device_inputs(mb, device: torch.device) -> dict[str, torch.Tensor]:
    """The model's inputs of micro-batch `mb` on `device`, copied without blocking the host
    (from pinned memory where the stream pinned it). Called on the prefetch thread ahead of the
    step (`pipeline.train.prefetch`), else by `train_group`: the one place where host-side work
    on a micro-batch's host tensors happens before its copy.
    """
    x = batch_tensors(mb, device)
    # A packed micro-batch's document boundaries, found on the host from its int32 document
    # numbers and attached to the device mask the model is called with: the forward reads
    # nothing back from the device for them (pipeline.learn.packed_attention).
    attach_documents(x["attention_mask"], mb.attention_mask)
    return x


def _to_device(values: Sequence[float], device: torch.device) -> torch.Tensor:
    """Host numbers as a float64 device tensor, copied without a host-device synchronisation."""
    t = torch.tensor(values, dtype=torch.float64)
    if device.type == "cuda":
        t = t.pin_memory()  # a non-blocking copy from pinned memory never waits
    return t.to(device, non_blocking=True)


def train_group(
    model: nn.Module,
    group: list,
    *,
    device: torch.device,
    world_size: int,
    bf16: bool = False,
    clip: tuple[Iterable[torch.Tensor], float] | None = None,
    extra: Callable[[], Sequence[float]] | None = None,
    ranges: Sequence[int] | None = None,
) -> GroupStats:
    """Forward and backward over this rank's micro-batches of `group` (one per global step);
    gradients accumulate in `model`, normalised over every supervised token of the group on all
    ranks. The caller steps the optimizer.

    `clip` = (parameters, max_norm): after backward (DDP's gradient all-reduce included) the
    global gradient is clipped as `clip_grad_norm_` does, its norm returned in `grad_norm`.
    `extra` is called once the backward is queued (host work that overlaps the device's); its
    numbers are summed over ranks in the step's one all-reduce and returned in `extra`.
    A micro-batch staged by `pipeline.train.prefetch` brings its device inputs (`mb.staged`).
    `ranges` (length-range edges) splits each step's token losses by the length of their
    document (`pipeline.learn.range_loss`), returned in `range_loss` and `range_tokens`; the
    sums travel in the same all-reduce and the same copy. Each step's sampling variance (within
    its ranges, or over the step) is computed from per-document sums that travel there too.
    """
    n = len(group)
    xs = [getattr(mb, "staged", None) or device_inputs(mb, device) for mb in group]
    # Supervised tokens (the first column never carries a loss), counted on the device.
    local_tokens = torch.stack([(x["labels"][:, 1:] != IGNORE_INDEX).sum() for x in xs])
    global_tokens = all_reduce(local_tokens.to(torch.float64))
    # DDP averages gradients over ranks; world_size undoes that average, so the update is the
    # gradient of (sum of all ranks' token losses) / (all supervised tokens); at least 1 token.
    total = global_tokens.sum().clamp(min=1.0)
    scale = total.new_full((), float(world_size)) / total  # one float64 division, as on the host
    R = len(ranges) - 1 if ranges else 0
    G = max(R, 1)  # the groups the document sums are split by: the ranges, or the whole step
    bounds = _to_device([float(e) for e in ranges[1:-1]], device) if R else None
    sums = []
    for i, x in enumerate(xs):
        # Only the last micro-step of the group all-reduces gradients.
        sync = i == n - 1 or not isinstance(model, DistributedDataParallel)
        with contextlib.nullcontext() if sync else model.no_sync():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(x["input_ids"], x["attention_mask"], x["position_ids"])
            loss_sum, correct, losses = token_sums(logits, x["labels"], per_token=True)
            (loss_sum * scale.to(loss_sum.dtype)).backward()
        row = [torch.stack([loss_sum.detach().double(), correct.double()])]
        row.append(document_stats(losses, x["labels"], x["attention_mask"], bounds, G))
        sums.append(torch.cat([r.flatten() for r in row]))
    norm = torch.full((1,), float("nan"), dtype=torch.float64, device=device)
    if clip is not None:
        params, max_norm = clip
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm).reshape(1).double()
    host = [[mb.num_real_tokens, mb.num_padded_tokens, len(mb.sample_ids)] for mb in group]
    flags = list(extra()) if extra is not None else []
    summed = torch.cat(
        [torch.stack(sums).flatten(), _to_device([v for r in host for v in r] + flags, device)]
    )
    all_reduce(summed)
    # The one synchronisation: every figure the host needs, in one copy.
    out = torch.cat([summed, global_tokens, norm]).cpu().numpy()
    w = 2 + 6 * G  # per micro-batch: loss sum, correct, then the [6, G] document sums
    per_mb = out[: w * n].reshape(n, w)
    docs = per_mb[:, 2:].reshape(n, 6, G)
    mine = np.empty((n, _SUMMED))
    mine[:, :2] = per_mb[:, :2]
    mine[:, 2:] = out[w * n : (w + 3) * n].reshape(n, 3)
    h = (w + 3) * n  # the caller's host numbers start here
    k = h + len(flags)
    return GroupStats(
        steps=[int(mb.step) for mb in group],
        buckets=[int(mb.bucket) for mb in group],
        loss_sum=mine[:, 0],
        correct=mine[:, 1],
        tokens=out[k : k + n],
        real=mine[:, 2],
        padded=mine[:, 3],
        samples=mine[:, 4],
        sample_ids=[np.asarray(mb.sample_ids) for mb in group],
        grad_norm=float(out[k + n]),
        extra=out[h:k],
        range_loss=docs[:, 0, :R],
        range_tokens=docs[:, 1, :R],
        noise=sampling_variance(docs),
    )
