"""Padded batches of a Hugging Face model: with SDPA (the default) they run causal SDPA with no
mask (exact: padding is on the right), reading nothing back from the device in the forward;
models whose attention is more than that keep their own implementation and the padding mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.core.collate import collate
from pipeline.core.config import ModelConfig
from pipeline.data.rechunk import MicroBatch
from pipeline.learn.factory import build_model
from pipeline.train.step import train_group
from tests.unit.test_step_syncs import DeviceReads, _mark

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def _model(**hf):
    torch.manual_seed(0)
    cfg = ModelConfig(name="hf_causal_lm", vocab_size=96, hf_config={**LLAMA, **hf})
    return build_model(cfg, 256)


def _padded(n: int = 6, upper: int = 64) -> MicroBatch:
    rng = np.random.default_rng(0)
    lens = rng.integers(5, upper, n)
    values = rng.integers(1, 96, int(lens.sum())).astype(np.int32)
    out = collate(values, np.concatenate([[0], np.cumsum(lens)]), upper=upper)
    t = {k: torch.as_tensor(v) for k, v in out.items() if np.ndim(v) == 2}
    return MicroBatch(0, 0, 0, np.arange(n), t["input_ids"], t["attention_mask"], t["labels"],
                      t["position_ids"], int(lens.sum()), n * upper)  # fmt: skip


@pytest.mark.parametrize("hf", [{}, {"model_type": "mistral", "sliding_window": 8}])
def test_padded_real_tokens_equal_the_configured_attention_with_its_mask(hf):
    model = _model(**hf).eval()
    mb = _padded()
    with torch.no_grad():
        ours = model(mb.input_ids, mb.attention_mask, mb.position_ids)
        model.hf.config._attn_implementation = "eager"  # the reference: eager, given the mask
        ref = model.hf(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                       position_ids=mb.position_ids, use_cache=False).logits  # fmt: skip
    real = mb.attention_mask.bool()
    torch.testing.assert_close(ours[real], ref[real], rtol=1e-4, atol=1e-5)
    assert model.causal == (hf == {})  # a windowed model keeps its own attention


def test_a_padded_hf_step_reads_the_device_once(tmp_path):
    """The step's one read (its figures). A mask-less call would make transformers search the
    position ids for packed sequences (an `.all()` read) in every forward."""
    model = _model()
    for p in list(model.parameters()) + list(model.buffers()):
        _mark(p)
    device = torch.device("cpu")
    reads = DeviceReads(device)
    with reads:
        train_group(model, [_padded()], device=device, world_size=1,
                    clip=(list(model.parameters()), 1.0))  # fmt: skip
    assert reads.what == ["cpu"], reads.what
