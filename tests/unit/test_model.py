"""The built-in model: causal, padding-blind, sized by config, chosen from the registry."""

import pytest
import torch

from pipeline.core.config import ModelConfig
from pipeline.learn.model import MODELS, build_model, count_parameters

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
