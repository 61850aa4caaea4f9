"""GPU path of the train step: bf16 autocast, pinned host batches, NCCL-free single process.
Skipped without a CUDA GPU; run by scripts/gpu_smoke.sh on a GPU machine."""

import numpy as np
import pytest
import torch

from pipeline.core.config import ModelConfig
from pipeline.data.rechunk import MicroBatch
from pipeline.learn.model import build_model
from pipeline.train.loop import train_group

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CFG = ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, d_ff=128)


def _batch(B: int, L: int, pin: bool) -> MicroBatch:
    ids = torch.randint(0, CFG.vocab_size, (B, L))
    mask = torch.ones_like(ids)
    mask[0, L // 2 :] = 0
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    pos = torch.arange(L).expand(B, L).contiguous() * mask
    t = [ids, mask, labels, pos]
    if pin:
        t = [x.pin_memory() for x in t]
    return MicroBatch(0, 0, 0, np.arange(B), *t, int(mask.sum()), B * L)


@pytest.mark.parametrize("bf16", [False, True])
def test_train_group_on_gpu_is_finite_and_learns(bf16):
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = build_model(CFG, 256).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mb = _batch(8, 64, pin=True)
    losses = []
    for _ in range(20):
        s = train_group(model, [mb], device=device, world_size=1, bf16=bf16)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(s.step_loss(0))
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_empty_micro_batch_on_gpu_has_zero_gradients():
    device = torch.device("cuda")
    model = build_model(CFG, 256).to(device)
    z = torch.zeros(0, 0, dtype=torch.int64)
    empty = MicroBatch(0, 0, 0, np.zeros(0, np.int64), z, z, z, z, 0, 0)
    train_group(model, [empty], device=device, world_size=1, bf16=True)
    assert all(not p.grad.any() for p in model.parameters())
