"""Optimizer and LR schedule: warmup to the peak, cosine to the floor or constant."""

import pytest
import torch

from pipeline.core.config import TrainConfig
from pipeline.learn.optim import build_optimizer, build_scheduler, lr_factor, optimizer_steps


def test_warmup_then_cosine_reaches_floor_at_last_step():
    f = [lr_factor(s, warmup=10, total=100, schedule="cosine", min_ratio=0.1) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(f[:10], f[1:10], strict=False))
    assert all(a >= b for a, b in zip(f[10:], f[11:], strict=False))
    assert f[-1] == pytest.approx(0.1)


def test_constant_schedule_stays_at_peak():
    f = [lr_factor(s, warmup=3, total=50, schedule="constant", min_ratio=0.1) for s in range(50)]
    assert f[2:] == [1.0] * 48


def test_scheduler_uses_warmup_ratio_and_peak_lr():
    model = torch.nn.Linear(4, 4)
    cfg = TrainConfig(lr=6e-4, warmup_ratio=0.1, schedule="constant")
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, total_steps=100)
    lrs = []
    for _ in range(12):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert (
        lrs[0] == pytest.approx(6e-5)
        and lrs[9] == pytest.approx(6e-4)
        and lrs[11] == pytest.approx(6e-4)
    )


def test_weight_decay_only_on_matrices():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    groups = build_optimizer(model, TrainConfig(weight_decay=0.1)).param_groups
    assert [p.dim() for p in groups[0]["params"]] == [2] and groups[0]["weight_decay"] == 0.1
    assert all(p.dim() == 1 for p in groups[1]["params"]) and groups[1]["weight_decay"] == 0.0


@pytest.mark.parametrize(
    "spe,epochs,max_steps,accum,expect",
    [(10, 2, None, 1, 20), (10, 2, None, 3, 8), (10, 3, 25, 4, 3 + 3 + 2), (10, 1, 5, 1, 5)],
)
def test_optimizer_steps_groups_never_span_epochs(spe, epochs, max_steps, accum, expect):
    cfg = TrainConfig(epochs=epochs, max_steps=max_steps, grad_accum=accum)
    assert optimizer_steps(spe, cfg) == expect


@pytest.mark.parametrize(
    "planned,epochs,max_steps,accum,expect",
    [
        ([10, 11], 2, None, 3, 4 + 4),  # each epoch's own count, groups cut at its end
        ([10, 11, 9], 3, 25, 4, 3 + 3 + 1),  # max_steps lands inside the third epoch
        ([7, 8], 2, 7, 2, 4),  # max_steps at the first epoch's end
    ],
)
def test_optimizer_steps_follow_each_epochs_planned_steps(
    planned, epochs, max_steps, accum, expect
):
    cfg = TrainConfig(epochs=epochs, max_steps=max_steps, grad_accum=accum)
    assert optimizer_steps(planned, cfg) == expect
