"""What the GPU path keeps exact and small: fp32 master weights and fused fp32 AdamW state under
bf16 autocast from a bf16 checkpoint; the chunked loss's backward holding one gradient of the
logits (no full-size tensor per chunk) and equal to the unchunked gradient; expandable segments
reaching the running allocator after Ray Train initialised CUDA; a compiled step.
Skipped without a CUDA GPU; run by scripts/gpu_smoke.sh on a GPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.collate import IGNORE_INDEX
from pipeline.core.config import ModelConfig, TrainConfig
from pipeline.data.rechunk import MicroBatch
from pipeline.learn.factory import build_model
from pipeline.learn.loss import token_sums
from pipeline.learn.optim import build_optimizer, compiled, master_weights
from pipeline.train.step import train_group

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 128


def _batch(B: int = 4, L: int = 64) -> MicroBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (B, L), generator=g)
    mask = torch.ones_like(ids)
    mask[0, L // 2 :] = 0
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, IGNORE_INDEX))
    pos = torch.arange(L).expand(B, L).contiguous() * mask
    return MicroBatch(0, 0, 0, np.arange(B), ids, mask, labels, pos, int(mask.sum()), B * L)


def test_a_bf16_checkpoint_trains_fp32_weights_and_fused_fp32_adamw_state(tmp_path):
    transformers = pytest.importorskip("transformers")
    conf = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
    )  # fmt: skip
    transformers.LlamaForCausalLM(conf).to(torch.bfloat16).save_pretrained(tmp_path / "m")
    cfg = ModelConfig(name="hf_causal_lm", vocab_size=VOCAB, hf_pretrained=str(tmp_path / "m"))
    device = torch.device("cuda")
    model = master_weights(build_model(cfg, 128), cfg).to(device)
    opt = build_optimizer(model, TrainConfig(lr=1e-3))
    assert all(g["fused"] for g in opt.param_groups)
    stats = train_group(model, [_batch()], device=device, world_size=1, bf16=True)
    assert np.isfinite(stats.loss_sum).all()
    opt.step()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    for s in opt.state.values():
        assert s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32
        assert s["step"].device.type == "cuda"  # fused keeps its step counts on the device


def test_chunked_loss_backward_holds_one_logits_gradient():
    """bf16 logits of 16K tokens x 32K vocab (1 GiB): the loss's forward and backward need the
    bf16 gradient (1 GiB) and a few chunk-sized fp32 temporaries (64 MiB each at 512 rows);
    one full-size zero-filled gradient per chunk would add another GiB or more."""
    device = torch.device("cuda")
    n, vocab, chunk = 16384, 32768, 512
    logits = torch.randn(1, n, vocab, device=device, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, n), device=device)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss, _ = token_sums(logits, labels, chunk_tokens=chunk)
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < logits.numel() * 2 + 8 * chunk * vocab * 4, extra


def test_chunked_loss_gradient_equals_the_unchunked_on_the_gpu():
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(2, 1000, 4096, device=device, generator=g).bfloat16().requires_grad_()
    labels = torch.randint(0, 4096, (2, 1000), device=device, generator=g)
    labels[1, 600:] = IGNORE_INDEX
    full, full_correct = token_sums(logits, labels, chunk_tokens=10**9)
    (g_full,) = torch.autograd.grad(full * 0.37, logits)
    chunked, chunked_correct = token_sums(logits, labels, chunk_tokens=256)
    (g_chunked,) = torch.autograd.grad(chunked * 0.37, logits)
    torch.testing.assert_close(chunked, full, rtol=1e-6, atol=0)
    assert int(chunked_correct) == int(full_correct)
    torch.testing.assert_close(g_chunked, g_full, rtol=0, atol=0)


def test_expandable_segments_reach_the_running_allocator():
    """As in a Ray Train worker: CUDA is initialised (its device set) before the loop applies
    the setting, which must still reach the allocator; a user's own value is left alone."""
    code = textwrap.dedent(
        """
        import os, torch
        from tests.helpers import tiny_config
        from pipeline.train.loop import use_allocator_setting
        torch.cuda.set_device(0)
        torch.empty(1, device="cuda")
        use_allocator_setting(tiny_config(), torch.device("cuda", 0))
        torch.empty(2**28, device="cuda")
        print("SETTINGS", torch._C._accelerator_getAllocatorSettings())
        print("ENV", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
        """
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    }
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "ENV expandable_segments:True" in out.stdout
    assert "expandable_segments:True" in out.stdout.split("SETTINGS", 1)[1].splitlines()[0]
    env["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:256"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "ENV max_split_size_mb:256" in out.stdout


def test_a_compiled_step_trains_like_the_eager_one():
    device = torch.device("cuda")
    cfg = ModelConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, d_ff=128)
    torch.manual_seed(0)
    eager = build_model(cfg, 128).to(device)
    torch.manual_seed(0)
    plain = build_model(cfg, 128).to(device)
    fast = compiled(plain)
    a = train_group(eager, [_batch()], device=device, world_size=1, bf16=True)
    b = train_group(fast, [_batch()], device=device, world_size=1, bf16=True)
    np.testing.assert_allclose(b.loss_sum, a.loss_sum, rtol=2e-2)
    assert list(plain.state_dict()) == list(eager.state_dict())  # no `_orig_mod.` prefix
    for p, q in zip(plain.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=5e-3)
