"""AdamW with decoupled weight decay on matrices only, and a linear-warmup then cosine/constant LR."""

from __future__ import annotations

import math

import torch
from torch import nn

from pipeline.core.config import TrainConfig
from pipeline.core.runlength import run_length

__all__ = ["build_optimizer", "build_scheduler", "lr_factor", "optimizer_steps"]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on parameters with >= 2 dims (matrices, embeddings), none on biases
    and norm scales, as in GPT-2 / nanoGPT."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))


def lr_factor(step: int, *, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak LR before optimizer step `step` (0-based).

    Linear warmup, (step + 1) / warmup, reaches the peak at step `warmup - 1`; after it
    `constant` stays at 1 and `cosine` decays to `min_ratio` at the last step, `total - 1`.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup - 1)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over `total_steps` optimizer steps; warmup from train.warmup_steps or warmup_ratio."""
    warmup = cfg.warmup_for(total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(
            s, warmup=warmup, total=total_steps, schedule=cfg.schedule, min_ratio=cfg.min_lr_ratio
        ),
    )


def optimizer_steps(steps_per_epoch: int, cfg: TrainConfig) -> int:
    """Optimizer steps of the whole run (pipeline.core.runlength.run_length owns the rule)."""
    return run_length(steps_per_epoch, cfg).optimizer_steps
