"""AdamW with decoupled weight decay on matrices only, and a linear-warmup then cosine/constant LR;
what the optimizer needs of the model: fp32 master weights (`master_weights`), and the compiled
forward (`compiled`, train.compile).

Weights and AdamW's moments stay fp32 whatever the checkpoint or config.json says (most Hugging
Face checkpoints are bf16, and transformers builds a model in the dtype its config names): bf16
comes only through autocast (train.bf16), so an update smaller than a bf16 weight's resolution is
not lost. A model bucketray builds is cast to fp32; a `package.module:factory` model that returns
other floating parameters is refused, naming the fix, rather than changed behind its author.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from pipeline.core.config import ModelConfig, TrainConfig
from pipeline.core.runlength import run_length

__all__ = [
    "RESUMED_SETTINGS",
    "adamw_implementation",
    "build_optimizer",
    "compiled",
    "build_scheduler",
    "load_with_current_settings",
    "lr_factor",
    "master_weights",
    "optimizer_settings",
    "optimizer_steps",
]


# The optimizer's implementation keys: the current device's choice, never a checkpoint's.
_IMPLEMENTATION = ("fused", "foreach")


def adamw_implementation(device_type: str) -> dict:
    """AdamW's implementation for parameters on `device_type`: `fused` on CUDA (one kernel for
    every parameter and its moments), `foreach` elsewhere (a few kernels per group instead of a
    loop over the parameters)."""
    return {"fused": True} if device_type == "cuda" else {"foreach": True}


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on parameters with >= 2 dims (matrices, embeddings), none on biases
    and norm scales, as in GPT-2 / nanoGPT. Build it once the model is on its device: the
    implementation follows the parameters' device (`adamw_implementation`)."""
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    device = params[0].device.type if params else "cpu"
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=tuple(cfg.betas), **adamw_implementation(device)
    )


def master_weights(model: nn.Module, cfg: ModelConfig) -> nn.Module:
    """`model`, built as `cfg` says, with fp32 floating parameters (module docstring): one that
    bucketray built (the registry, `hf_causal_lm`) is cast (`model.float()`, buffers included);
    a `package.module:factory` model is refused in one line."""
    other = [
        (n, p.dtype)
        for n, p in model.named_parameters()
        if p.is_floating_point() and p.dtype != torch.float32
    ]
    if not other:
        return model
    from pipeline.learn.factory import model_kind

    if model_kind(cfg.name) != "factory":
        return model.float()
    from pipeline.learn.model_check import ModelBuildError

    dtypes = ", ".join(sorted({str(d).removeprefix("torch.") for _, d in other}))
    total = sum(1 for p in model.parameters() if p.is_floating_point())
    raise ModelBuildError(
        f"model.name={cfg.name!r} returned {len(other)} of {total} parameters in {dtypes} (e.g. "
        f"{other[0][0]}): bucketray trains fp32 weights and AdamW state, with bf16 through "
        "autocast (train.bf16); return the model in float32 (model.float())"
    )


def compiled(model: nn.Module) -> nn.Module:
    """`model` (the module the step calls: the model or its DDP wrapper) with a compiled
    forward (train.compile). A DDP wrapper is compiled in place (`nn.Module.compile`), so it
    stays a DistributedDataParallel (the step's `no_sync`) and TorchDynamo still splits the
    graph at its gradient buckets; a bare model is wrapped by `torch.compile`. Either way the
    model the checkpoints save is untouched: no `_orig_mod.` prefix in its state_dict."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.compile()
        return model
    return torch.compile(model)


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


def optimizer_steps(steps_per_epoch: int | Sequence[int], cfg: TrainConfig) -> int:
    """Optimizer steps of the whole run (pipeline.core.runlength.run_length owns the rule);
    `steps_per_epoch`: one count for every epoch, or each epoch's planned count."""
    return run_length(steps_per_epoch, cfg).optimizer_steps


# The optimizer settings a resume takes from the current config (the checkpoint keeps the
# moments, step counts and the schedule's position): a lower train.lr after a loss spike is the
# usual reason to resume with an edited config.
RESUMED_SETTINGS = ("lr", "weight_decay", "betas", "grad_clip", "min_lr_ratio", "schedule")


def optimizer_settings(cfg: TrainConfig, total_steps: int) -> dict:
    """What a checkpoint records of the optimizer settings (`train.*`, warmup resolved to
    optimizer steps), to name what a resume changes."""
    out = {k: getattr(cfg, k) for k in RESUMED_SETTINGS}
    out["betas"] = list(cfg.betas)
    out["warmup_steps"] = cfg.warmup_for(total_steps)
    return out


def _settings_of(opt_state: dict, sched_state: dict) -> dict:
    """The settings an older checkpoint (without a record) shows in its optimizer's state."""
    g = opt_state["param_groups"][0]
    base = sched_state.get("base_lrs") or [g.get("initial_lr", g["lr"])]
    return {"lr": base[0], "weight_decay": g["weight_decay"], "betas": list(g["betas"])}


def load_with_current_settings(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    opt_state: dict,
    sched_state: dict,
    recorded: dict | None,
    current: dict,
) -> list[str]:
    """Load the optimizer's and scheduler's state from a checkpoint, keeping the settings the
    current config gave them (peak lr, weight decay, betas per parameter group; the schedule's
    shape: its lambdas are this config's). Returns what changed, as `train.<key>: old -> new`
    (`recorded`: the checkpoint's `optimizer_settings`, None in older checkpoints). The
    implementation (fused, foreach) is this device's: it is set before the load, which puts the
    step counts where it keeps them (on the device for fused)."""
    groups = [{k: g[k] for k in ("weight_decay", "betas")} for g in optimizer.param_groups]
    impl = [{k: g[k] for k in _IMPLEMENTATION if k in g} for g in optimizer.param_groups]
    base = list(scheduler.base_lrs)
    saved = opt_state["param_groups"]
    if len(saved) == len(impl):  # else the load refuses the checkpoint's groups itself
        opt_state = {
            **opt_state,
            "param_groups": [{**s, **i} for s, i in zip(saved, impl, strict=True)],
        }
    optimizer.load_state_dict(opt_state)
    scheduler.load_state_dict(sched_state)  # function lambdas are not in its state: ours stay
    scheduler.base_lrs = base
    for g, hp, b, fn in zip(
        optimizer.param_groups, groups, base, scheduler.lr_lambdas, strict=True
    ):
        g.update(hp, initial_lr=b, lr=b * fn(scheduler.last_epoch))
    # What get_last_lr() answers until the next scheduler.step() (the LR the next step uses).
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    old = recorded if recorded is not None else _settings_of(opt_state, sched_state)
    return [
        f"train.{k}: {old[k]!r} -> {current[k]!r}"
        for k in current
        if k in old and _differs(old[k], current[k])
    ]


def _differs(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) != len(b) or any(_differs(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, float) or isinstance(b, float):
        return not math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    return a != b
