"""Hugging Face's own length-grouped samplers, run on a set of lengths (optional dependency).

`transformers` is an optional extra: `available()` says whether it imports. The samplers are run
exactly as a Trainer would run them, one instance per rank, and their micro-batches are returned
in (step, rank) order for `pipeline.core.metrics.micro_batch_padded`. The pure-numpy simulation in
`peers.hf_length_grouped` is held to these within 0.005 by a test.
"""

from __future__ import annotations

import numpy as np

__all__ = ["available", "length_grouped", "batch_rebalance"]


def available() -> bool:
    try:
        import transformers.trainer_pt_utils  # noqa: F401
    except ImportError:
        return False
    return True


def _interleave(per_rank: list[list[list[int]]]) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-rank lists of batches -> (ids in (step, rank) order, offsets, steps); a rank with
    fewer batches contributes empty micro-batches."""
    steps = max(len(b) for b in per_rank)
    ids, sizes = [], []
    for s in range(steps):
        for batches in per_rank:
            mb = batches[s] if s < len(batches) else []
            ids.extend(mb)
            sizes.append(len(mb))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return np.asarray(ids, dtype=np.int64), offsets, steps


def length_grouped(
    lengths: np.ndarray, per_device_batch: int, world_size: int = 1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, int]:
    """`LengthGroupedSampler` (one rank) or `DistributedLengthGroupedSampler`, each rank's indices
    batched by `per_device_batch` like a DataLoader without drop_last."""
    import torch
    from transformers.trainer_pt_utils import (
        DistributedLengthGroupedSampler,
        LengthGroupedSampler,
    )

    lens = [int(x) for x in lengths]
    per_rank = []
    for r in range(world_size):
        if world_size == 1:
            g = torch.Generator().manual_seed(seed)
            order = list(LengthGroupedSampler(per_device_batch, lengths=lens, generator=g))
        else:
            sampler = DistributedLengthGroupedSampler(
                per_device_batch, num_replicas=world_size, rank=r, seed=seed, lengths=lens
            )
            order = list(sampler)
        per_rank.append(
            [order[i : i + per_device_batch] for i in range(0, len(order), per_device_batch)]
        )
    return _interleave(per_rank)


def batch_rebalance(
    lengths: np.ndarray, global_batch: int, world_size: int = 1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, int]:
    """`BatchRebalanceSampler` with `global_batch` samples per step over `world_size` ranks (no
    gradient accumulation, the tail kept)."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    lens = [int(x) for x in lengths]
    per_rank = [
        list(
            BatchRebalanceSampler(
                lens,
                effective_batch_size=global_batch,
                dp_size=world_size,
                grad_accum=1,
                seed=seed,
                rank=r,
                drop_last=False,
            )
        )
        for r in range(world_size)
    ]
    return _interleave(per_rank)
