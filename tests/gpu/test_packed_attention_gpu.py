"""On CUDA, packed rows run flash varlen attention, and it computes what the exact masked path
computes. Skipped without a CUDA GPU (the CPU path is tested in tests/unit/test_packed_attention.py)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.core.collate import collate
from pipeline.core.config import ModelConfig
from pipeline.core.packed_collate import collate_packed
from pipeline.learn import packed_attention
from pipeline.learn.factory import build_model
from pipeline.learn.packed_attention import block_causal_mask, document_attention, varlen_usable

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _doc_ids(B, T, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(B):
        lens = []
        while sum(lens) < T - 64:
            lens.append(int(rng.integers(1, 700)))
        lens[-1] -= max(sum(lens) - (T - 64), 0)
        lens = [n for n in lens if n > 0]
        ids = np.concatenate(
            [np.full(n, d + 1) for d, n in enumerate(lens)] + [np.zeros(T - sum(lens))]
        )
        rows.append(ids)
    return torch.as_tensor(np.stack(rows), dtype=torch.long, device="cuda")


def test_varlen_equals_the_masked_path_in_bf16():
    B, H, T, D = 2, 4, 2048, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(B, H, T, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3)
    )
    doc = _doc_ids(B, T)
    assert varlen_usable(q, 0.0)
    out = document_attention(q, k, v, doc)
    ref = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=block_causal_mask(doc)
    )
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_the_tiny_decoder_runs_varlen_and_matches_each_document_alone(monkeypatch):
    calls = []
    real = packed_attention.cu_seqlens
    monkeypatch.setattr(packed_attention, "cu_seqlens", lambda d: calls.append(1) or real(d))
    cfg = ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, d_ff=128)
    torch.manual_seed(0)
    model = build_model(cfg, 256).cuda().eval()
    lens = [30, 100, 7, 64, 50]
    rng = np.random.default_rng(0)
    values = rng.integers(0, 128, sum(lens)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    b = collate_packed(values, offsets, [0, 3, 5], row_tokens=256)
    t = {k: torch.as_tensor(v).cuda() for k, v in b.items() if np.ndim(v) == 2}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        packed = model(t["input_ids"], t["attention_mask"], t["position_ids"]).float()
        assert calls, "the packed batch did not take the varlen path"
        row, pos = 0, 0
        for d, n in enumerate(lens):
            if d == 3:
                row, pos = 1, 0
            one = collate(
                values[offsets[d] : offsets[d + 1]], [0, n], upper=256, pad_to_multiple_of=1
            )
            o = {k: torch.as_tensor(v).cuda() for k, v in one.items() if np.ndim(v) == 2}
            alone = model(o["input_ids"], o["attention_mask"], o["position_ids"]).float()[0]
            torch.testing.assert_close(packed[row, pos : pos + n], alone, atol=5e-2, rtol=5e-2)
            pos += n


def test_varlen_backward_equals_the_masked_path_in_bf16():
    """Gradients of q, k and v through flash varlen (bf16) against the fp32 block-mask
    reference's: each within 2% of its norm (bf16 keeps 8 bits of mantissa; the forward above
    holds to 2e-2 elementwise)."""
    B, H, T, D = 2, 4, 1024, 64
    g = torch.Generator(device="cuda").manual_seed(1)
    base = [torch.randn(B, H, T, D, device="cuda", generator=g) for _ in range(3)]
    doc = _doc_ids(B, T, seed=1)
    grad_out = torch.randn(B, H, T, D, device="cuda", generator=g)
    real = (doc > 0)[:, None, :, None]  # the padding tail attends to itself only: compared too
    q, k, v = (x.to(torch.bfloat16).requires_grad_() for x in base)
    assert varlen_usable(q, 0.0)
    (document_attention(q, k, v, doc).float() * grad_out * real).sum().backward()
    rq, rk, rv = (x.clone().requires_grad_() for x in base)
    ref = F.scaled_dot_product_attention(rq, rk, rv, attn_mask=block_causal_mask(doc))
    (ref * grad_out * real).sum().backward()
    for name, ours, theirs in (("q", q, rq), ("k", k, rk), ("v", v, rv)):
        err = float((ours.grad.float() - theirs.grad).norm() / theirs.grad.norm())
        assert err < 2e-2, f"d{name} differs by {err:.3g} of its norm"
