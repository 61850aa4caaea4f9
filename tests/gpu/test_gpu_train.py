"""GPU path of the train step: bf16 autocast, pinned host batches, NCCL-free single process; the
flash attention kernel usable by the model; the chunked loss's memory; the current device's RNG.
Skipped without a CUDA GPU; run by scripts/gpu_smoke.sh on a GPU machine."""

import numpy as np
import pytest
import torch

from pipeline.core.config import ModelConfig
from pipeline.data.rechunk import MicroBatch
from pipeline.learn.checkpoint import rng_state, set_rng_state
from pipeline.learn.factory import build_model
from pipeline.learn.loss import token_sums
from pipeline.train.step import train_group

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


def test_model_runs_on_the_flash_kernel_alone():
    """No explicit attention mask: SDPA restricted to the flash backend still runs (with a
    [B, 1, L, L] mask it raises, no kernel being available)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = torch.device("cuda")
    model = build_model(CFG, 2048).to(device)
    mb = _batch(2, 1024, pin=False)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(*(t.to(device) for t in (mb.input_ids, mb.attention_mask, mb.position_ids)))
    assert torch.isfinite(logits).all()


def test_chunked_loss_never_holds_the_fp32_logits_of_the_micro_batch():
    """bf16 logits of 16K tokens x 32K vocab (1 GiB): forward and backward of the loss need their
    bf16 gradient (1 GiB) plus chunk-sized temporaries, below gradient + one fp32 copy (3 GiB);
    unchunked they also hold the fp32 copy and its log-softmax (4 GiB more)."""
    device = torch.device("cuda")
    n, vocab = 16384, 32768
    logits = torch.randn(1, n, vocab, device=device, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, n), device=device)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss, _ = token_sums(logits, labels, chunk_tokens=2048)
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    fp32_copy = n * vocab * 4
    assert extra < logits.numel() * 2 + fp32_copy, extra


def test_rng_state_is_the_current_devices():
    state = rng_state()
    assert len(state["cuda"]) == 1
    a = torch.rand(3, device="cuda")
    set_rng_state(state)
    torch.testing.assert_close(torch.rand(3, device="cuda"), a)
