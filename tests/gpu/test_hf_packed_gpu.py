"""On CUDA, a Hugging Face model's packed rows run bucketray's attention function through flash
varlen_attn, and each document computes what it computes alone, in bf16 autocast: logits within
atol = rtol = 5e-2 (bf16 keeps 8 bits of mantissa; the kernels differ from the padded path's),
parameter gradients within 3% of their norm. For sdpa and, where the flash-attn package is
installed, flash_attention_2; with grouped-query heads and a sliding window. Skipped without a
CUDA GPU (the CPU paths are tested in tests/unit/test_hf_packed_attention.py)."""

import numpy as np
import pytest
import torch

from pipeline.core.collate import collate
from pipeline.core.config import ModelConfig
from pipeline.core.packed_collate import collate_packed
from pipeline.learn import packed_attention
from pipeline.learn.factory import build_model
from pipeline.learn.loss import token_sums
from pipeline.learn.packed_attention import attach_documents

transformers = pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

VOCAB, ROW = 256, 256
LENS = [30, 100, 7, 64, 50, 90, 41]
ROWS = [0, 3, 5, 7]  # three rows: 137, 114 and 131 tokens
LLAMA = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": ROW,
}
MISTRAL = {**LLAMA, "model_type": "mistral", "sliding_window": 24}  # shorter than most docs
GRAD_TOLERANCE = 3e-2  # |packed - alone| / |alone| per parameter gradient


def _flash_available() -> bool:
    from transformers.utils import is_flash_attn_2_available

    return is_flash_attn_2_available()


def _batches():
    rng = np.random.default_rng(0)
    values = rng.integers(0, VOCAB, sum(LENS)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(LENS)])
    packed = collate_packed(values, offsets, ROWS, row_tokens=ROW)
    packed = {k: torch.as_tensor(v) for k, v in packed.items() if np.ndim(v) == 2}
    alone = []
    for a, b in zip(offsets[:-1], offsets[1:], strict=True):
        one = collate(values[a:b], [0, b - a], upper=ROW, pad_to_multiple_of=1)
        alone.append({k: torch.as_tensor(v).cuda() for k, v in one.items() if np.ndim(v) == 2})
    return packed, alone


def _slices():
    out = []
    for r in range(len(ROWS) - 1):
        pos = 0
        for d in range(ROWS[r], ROWS[r + 1]):
            out.append((r, pos, pos + LENS[d]))
            pos += LENS[d]
    return out


def _model(hf_config, impl):
    torch.manual_seed(0)
    cfg = ModelConfig(name="hf_causal_lm", vocab_size=VOCAB, hf_config=hf_config)
    model = build_model(cfg, ROW).cuda()
    model.hf.set_attn_implementation(impl)
    return model


def _run(model, b):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(b["input_ids"], b["attention_mask"], b["position_ids"])
        loss, _ = token_sums(logits.float(), b["labels"])
    return logits.float(), loss


IMPLS = [
    pytest.param("sdpa"),
    pytest.param(
        "flash_attention_2",
        marks=pytest.mark.skipif(not _flash_available(), reason="flash-attn is not installed"),
    ),
]


@pytest.mark.parametrize("hf_config", [LLAMA, MISTRAL], ids=["llama-gqa", "mistral-window"])
@pytest.mark.parametrize("impl", IMPLS)
def test_packed_rows_equal_each_document_alone_in_bf16(hf_config, impl, monkeypatch):
    calls = []
    real = packed_attention._varlen
    monkeypatch.setattr(packed_attention, "_varlen", lambda *a: calls.append(1) or real(*a))
    model = _model(hf_config, impl)
    packed_cpu, alone = _batches()
    packed = {k: v.cuda() for k, v in packed_cpu.items()}
    attach_documents(packed["attention_mask"], packed_cpu["attention_mask"])
    logits, loss = _run(model, packed)
    assert calls, "the packed batch did not take the varlen path"
    loss.backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    for (r, a, e), one in zip(_slices(), alone, strict=True):
        one_logits, one_loss = _run(model, one)
        torch.testing.assert_close(
            logits[r, a:e].detach(), one_logits[0].detach(), atol=5e-2, rtol=5e-2
        )
        one_loss.backward()
    assert packed_grads
    for n, p in model.named_parameters():
        if p.grad is None:
            continue
        err = float((packed_grads[n] - p.grad).norm() / p.grad.norm().clamp_min(1e-12))
        assert err < GRAD_TOLERANCE, f"{n}: gradient differs by {err:.3g} of its norm"
    assert model.hf.config._attn_implementation == impl
