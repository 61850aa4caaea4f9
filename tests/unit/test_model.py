"""The built-in model: causal, padding-blind, sized by config, chosen from the registry."""

import pytest
import torch

from pipeline.core.config import ModelConfig
from pipeline.learn.factory import build_model
from pipeline.learn.model import MODELS, count_parameters

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64)


def _inputs(B=2, L=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, CFG.vocab_size, (B, L), generator=g)
    return ids, torch.ones_like(ids), torch.arange(L).expand(B, L).clone()


def test_logits_shape_and_registry():
    model = build_model(CFG, max_positions=16)
    ids, mask, pos = _inputs()
    assert model(ids, mask, pos).shape == (2, 8, CFG.vocab_size)
    assert "tiny_decoder" in MODELS
    assert count_parameters(model) < sum(p.numel() for p in model.parameters()) + 1


def test_unknown_model_names_the_registry():
    with pytest.raises(ValueError, match="model.name='nope'.*tiny_decoder"):
        build_model(CFG.model_copy(update={"name": "nope"}), max_positions=16)


def test_causal_future_tokens_do_not_change_earlier_logits():
    model = build_model(CFG, max_positions=16).eval()
    ids, mask, pos = _inputs(B=1)
    changed = ids.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % CFG.vocab_size
    a, b = model(ids, mask, pos), model(changed, mask, pos)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_padding_does_not_change_real_positions():
    """A row padded to a longer batch gives the same logits on its real tokens as alone."""
    model = build_model(CFG, max_positions=16).eval()
    ids, mask, pos = _inputs(B=1, L=5)
    padded = torch.cat([ids, torch.full((1, 3), 7)], dim=1)
    pmask = torch.cat([mask, torch.zeros(1, 3, dtype=torch.int64)], dim=1)
    ppos = torch.cat([pos, torch.zeros(1, 3, dtype=torch.int64)], dim=1)
    out = model(padded, pmask, ppos)
    torch.testing.assert_close(out[:, :5], model(ids, mask, pos), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()


def _explicit_mask_forward(model, ids, mask, pos):
    """The model with a [B, 1, L, L] causal-and-key-padding mask given to SDPA instead of the
    causal flag: the reference the flag must match at real positions."""
    import torch.nn.functional as F

    B, L = ids.shape
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    m = causal[None, None] & mask.bool()[:, None, None, :]
    x = model.tok(ids) + model.pos(pos)
    for blk in model.blocks:
        D = x.shape[-1]
        q, k, v = blk.qkv(blk.ln1(x)).view(B, L, 3, blk.n_heads, D // blk.n_heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=m
        )
        x = x + blk.proj(att.transpose(1, 2).reshape(B, L, D))
        x = x + blk.mlp(blk.ln2(x))
    return model.head(model.ln_f(x))


def test_causal_flag_equals_explicit_padding_mask_at_real_positions():
    """Right padding: the causal flag alone gives the explicit-mask logits at every real token."""
    torch.manual_seed(0)
    model = build_model(CFG, max_positions=16).eval()
    ids = torch.randint(0, CFG.vocab_size, (3, 12))
    lens = torch.tensor([12, 7, 2])
    mask = (torch.arange(12)[None] < lens[:, None]).long()
    pos = torch.arange(12).expand(3, 12) * mask
    got = model(ids, mask, pos)
    ref = _explicit_mask_forward(model, ids, mask, pos)
    real = mask.bool()
    torch.testing.assert_close(got[real], ref[real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got).all()


def test_attention_gets_the_causal_flag_and_no_mask(monkeypatch):
    """No explicit [B, 1, L, L] mask, so SDPA may pick the flash kernel on a GPU."""
    import pipeline.learn.model as model_mod

    seen = []
    sdpa = model_mod.F.scaled_dot_product_attention

    def spy(*args, **kw):
        seen.append((kw.get("attn_mask"), kw.get("is_causal")))
        return sdpa(*args, **kw)

    monkeypatch.setattr(model_mod.F, "scaled_dot_product_attention", spy)
    model = build_model(CFG, max_positions=16)
    model(*_inputs())
    assert seen == [(None, True)] * CFG.n_layers
