"""Hugging Face models on packed rows attend within documents through bucketray's attention
function, whatever attention implementation they are configured with: logits and gradients of a
packed batch of several rows equal each document run alone (fp32: rtol 1e-4, atol 1e-5 for
logits; rtol 1e-4, atol 1e-6 for gradients), with grouped-query heads and sliding windows; no
[B, 1, T, T] mask is built; a forward whose documents were described on the host reads nothing
back from the device; a model that does not hand attention its documents is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline.core.config import ModelConfig
from pipeline.learn import packed_attention
from pipeline.learn.factory import build_model
from pipeline.learn.loss import token_sums
from pipeline.learn.packed_attention import block_causal_mask, require_packed_support
from tests.helpers import TINY_LLAMA
from tests.unit.test_packed_attention import (
    ROW_TOKENS,
    VOCAB,
    _fwd,
    _one_doc_batches,
    _packed_batch,
    _packed_slices,
)

transformers = pytest.importorskip("transformers")

WINDOW = 4  # shorter than four of the six documents
BASE = {k: v for k, v in TINY_LLAMA.items() if k != "model_type"}  # 4 query heads, 2 key/value
ARCHS = {
    "llama-gqa": TINY_LLAMA,
    "mistral-window": {**BASE, "model_type": "mistral", "sliding_window": WINDOW},
    "qwen2-window": {  # layer 0 full, layer 1 sliding
        **BASE,
        "model_type": "qwen2",
        "use_sliding_window": True,
        "sliding_window": WINDOW,
        "max_window_layers": 1,
    },
}
FLASH = "flash_attention_2"
CASES = [
    ("llama-gqa", "sdpa"),
    ("llama-gqa", "eager"),
    ("llama-gqa", "flex_attention"),
    ("llama-gqa", FLASH),
    ("mistral-window", "sdpa"),
    ("mistral-window", FLASH),
    ("qwen2-window", "eager"),
]
# FlexAttention has no backward pass on CPU (torch 2.13), so the documents alone cannot be
# differentiated through it here; its packed rows run bucketray's attention like every other's.
GRADIENT_CASES = [c for c in CASES if c[1] != "flex_attention"]


def _cpu_flash(module, q, k, v, attention_mask, dropout=0.0, scaling=None, **kw):
    """What transformers' flash path computes (modeling_flash_attention_utils.
    _flash_attention_forward), with SDPA as the kernel so it runs on CPU: a padding mask unpads
    each row (padding is on the right: causal attention already keeps real queries off it);
    without one, restarting position_ids are read as documents only when the batch is one row
    (`_is_packed_sequence`); otherwise each row is one causal sequence."""
    from transformers.modeling_flash_attention_utils import _is_packed_sequence

    B, H, T, _ = q.shape
    k, v = (x.repeat_interleave(H // x.shape[1], 1) for x in (k, v))
    pos, window = kw.get("position_ids"), kw.get("sliding_window")
    doc = torch.ones(B, T, dtype=torch.int32)
    if attention_mask is None and _is_packed_sequence(pos, B):
        doc = (pos == 0).cumsum(-1).to(torch.int32)
    mask = block_causal_mask(doc, window)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


@pytest.fixture
def cpu_flash(monkeypatch):
    """`flash_attention_2` served by `_cpu_flash`: the flash implementation's behaviour on CPU."""
    from transformers.modeling_utils import AttentionInterface

    monkeypatch.setitem(AttentionInterface._global_mapping, FLASH, _cpu_flash)


def _hf(arch: str, impl: str):
    torch.manual_seed(0)
    cfg = ModelConfig(name="hf_causal_lm", vocab_size=VOCAB, hf_config=ARCHS[arch])
    model = build_model(cfg, ROW_TOKENS).eval()
    # set directly: transformers would refuse flash_attention_2 without the flash-attn package
    model.hf.config._attn_implementation = impl
    return model


@pytest.mark.parametrize("arch, impl", CASES)
def test_packed_rows_equal_each_document_alone_for_every_attention_implementation(
    arch, impl, cpu_flash
):
    model = _hf(arch, impl)
    b = _packed_batch()
    assert b["input_ids"].shape[0] >= 2  # several rows: flash's own packing sees one row only
    with torch.no_grad():
        packed = _fwd(model, b)
        for (r, a, e), one in zip(_packed_slices(), _one_doc_batches(), strict=True):
            alone = _fwd(model, one)[0, : e - a]
            torch.testing.assert_close(packed[r, a:e], alone, rtol=1e-4, atol=1e-5)
    assert model.hf.config._attn_implementation == impl  # padded batches keep the user's
    require_packed_support(model)  # and the self-check lets it train


@pytest.mark.parametrize("arch, impl", GRADIENT_CASES)
def test_packed_gradients_equal_the_per_document_ones_for_every_attention_implementation(
    arch, impl, cpu_flash
):
    model = _hf(arch, impl)
    b = _packed_batch()
    loss, _ = token_sums(_fwd(model, b), b["labels"])
    loss.backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    for one in _one_doc_batches():
        token_sums(_fwd(model, one), one["labels"])[0].backward()
    assert packed
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(packed[n], p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_the_packed_path_builds_no_row_square_mask(impl, monkeypatch):
    from transformers.masking_utils import AttentionMaskInterface

    model = _hf("llama-gqa", impl)
    b = _packed_batch()
    with torch.no_grad():
        expected = _fwd(model, b)

        def refuse(*a, **k):
            raise AssertionError("a [B, 1, T, T] mask was built for a packed batch")

        monkeypatch.setattr(packed_attention, "block_causal_mask", refuse)
        for name in ("sdpa", "eager"):
            monkeypatch.setitem(AttentionMaskInterface._global_mapping, name, refuse)
        torch.testing.assert_close(_fwd(model, b), expected, rtol=0, atol=0)


def test_a_flash_model_that_does_not_hand_attention_the_documents_is_refused(
    cpu_flash, monkeypatch
):
    """The self-check runs for flash implementations too: here the attention modules drop the
    keyword arguments transformers passes down, as a model written without them would."""
    from transformers.models.llama import modeling_llama

    model = _hf("llama-gqa", FLASH)
    forward = modeling_llama.LlamaAttention.forward

    def without_kwargs(self, hidden_states, position_embeddings=None, attention_mask=None, **kw):
        return forward(self, hidden_states, position_embeddings, attention_mask)

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", without_kwargs)
    with pytest.raises(ValueError, match=r"cannot train model.hf_config: .*documents") as e:
        require_packed_support(model)
    assert "\n" not in str(e.value)


def test_a_forward_with_documents_described_on_the_host_reads_nothing_back(monkeypatch):
    """The step describes a micro-batch's documents from its CPU copy before the forward
    (`attach_documents`); the forward and backward then never read a tensor back to the host."""
    from pipeline.learn.packed_attention import attach_documents

    b = _packed_batch()
    models = [_hf("llama-gqa", "sdpa"), _hf("mistral-window", "eager")]
    torch.manual_seed(0)
    models.append(build_model(ModelConfig(vocab_size=VOCAB, d_model=32, n_heads=4), ROW_TOKENS))

    def refuse(*a, **k):
        raise AssertionError("the forward read a tensor back to the host")

    for model in models:
        with torch.no_grad():
            want = _fwd(model, b)
        mask = attach_documents(b["attention_mask"].clone(), b["attention_mask"])
        with monkeypatch.context() as m:
            for name in ("cpu", "numpy", "item", "tolist", "__int__", "__bool__", "nonzero"):
                m.setattr(torch.Tensor, name, refuse)
            m.setattr(torch, "nonzero", refuse)
            out = model(b["input_ids"], mask, b["position_ids"])
            out.sum().backward()
        torch.testing.assert_close(out.detach(), want, rtol=1e-5, atol=1e-6)


def test_documents_on_the_host_describe_what_the_device_path_finds():
    from pipeline.learn.packed_attention import Documents, documents_on_host

    doc = _packed_batch()["attention_mask"]
    host, device = documents_on_host(doc, torch.device("cpu")), Documents(doc)
    assert host.cu_seqlens[0].tolist() == device.cu_seqlens[0].tolist()
    assert host.cu_seqlens[1] == device.cu_seqlens[1] == 16  # row 2: 4 tokens, 16 of padding
    assert host.cu_seqlens[0].dtype == torch.int32
    for a, e in zip(host.groups, device.groups, strict=True):
        assert a == e if isinstance(a, list) else torch.equal(a, e)


def test_gradient_checkpointing_is_refused_on_packed_rows():
    """Checkpointed layers recompute attention in the backward pass, after the forward has put
    the user's attention implementation back: the recomputation would cross documents."""
    model = _hf("llama-gqa", "sdpa")
    model.hf.gradient_checkpointing_enable()
    with pytest.raises(ValueError, match="gradient checkpointing"):
        require_packed_support(model)


@pytest.mark.parametrize("one_node", [True, False], ids=["cpu-flash-node", "autograd-graph"])
def test_document_attention_keeps_a_window_scale_and_grouped_heads_within_documents(
    one_node, monkeypatch
):
    if not one_node:  # the path a GPU in fp32, or attention dropout, takes
        monkeypatch.setattr(packed_attention, "_flash_cpu_usable", lambda qkv, p: False)
    doc = _packed_batch()["attention_mask"]
    B, T = doc.shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, 4, T, 8, generator=g, requires_grad=True)
    k, v = (torch.randn(B, 2, T, 8, generator=g, requires_grad=True) for _ in range(2))
    out = packed_attention.document_attention(q, k, v, doc, scale=0.3, window=WINDOW)
    kr, vr = (x.repeat_interleave(2, 1) for x in (k, v))
    mask = block_causal_mask(doc, WINDOW)
    ref = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, scale=0.3)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    w = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    for a, e in zip(grads, torch.autograd.grad((ref * w).sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
