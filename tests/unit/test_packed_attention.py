"""Packed rows compute what their documents compute alone: logits, loss and gradients, for the
tiny decoder and a tiny Hugging Face Llama; the loss never predicts across a document boundary."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.core.collate import IGNORE_INDEX, collate
from pipeline.core.config import ModelConfig
from pipeline.core.packed_collate import collate_packed
from pipeline.learn import length_groups as grouping
from pipeline.learn import packed_attention
from pipeline.learn.factory import build_model
from pipeline.learn.loss import supervised_tokens, token_sums
from pipeline.learn.packed_attention import (
    block_causal_mask,
    cu_seqlens,
    grouped_document_attention,
    is_packed,
    length_groups,
    require_packed_support,
)
from tests.helpers import TINY_LLAMA

VOCAB = 64
DOC_LENS = [5, 9, 3, 7, 12, 4]
ROWS = [0, 3, 5, 6]  # row 0: docs 0-2 (17 tokens), row 1: docs 3-4 (19), row 2: doc 5 (4)
ROW_TOKENS = 20
TINY = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=64)


def _docs(seed=0):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, VOCAB, sum(DOC_LENS)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(DOC_LENS)])
    return values, offsets


def _t(batch):
    return {k: torch.as_tensor(v) for k, v in batch.items() if np.ndim(v) == 2}


def _packed_batch():
    values, offsets = _docs()
    return _t(collate_packed(values, offsets, ROWS, row_tokens=ROW_TOKENS))


def _one_doc_batches():
    values, offsets = _docs()
    return [
        _t(collate(values[a:b], [0, b - a], upper=ROW_TOKENS, pad_to_multiple_of=1))
        for a, b in zip(offsets[:-1], offsets[1:], strict=True)
    ]


def _packed_slices():
    """(row, start, end) of each document in the packed batch."""
    out = []
    for r in range(len(ROWS) - 1):
        pos = 0
        for d in range(ROWS[r], ROWS[r + 1]):
            out.append((r, pos, pos + DOC_LENS[d]))
            pos += DOC_LENS[d]
    return out


def _tiny():
    torch.manual_seed(0)
    return build_model(TINY, max_positions=ROW_TOKENS).eval()


def _llama(impl=None):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(name="hf_causal_lm", vocab_size=VOCAB, hf_config=TINY_LLAMA), ROW_TOKENS
    ).eval()
    if impl:
        model.hf.set_attn_implementation(impl)
    return model


def _fwd(model, b):
    return model(b["input_ids"], b["attention_mask"], b["position_ids"])


def test_packed_collate_numbers_documents_restarts_positions_and_cuts_boundary_labels():
    b = collate_packed(*_docs(), ROWS, row_tokens=ROW_TOKENS)
    assert b["input_ids"].shape == (3, ROW_TOKENS)
    assert b["attention_mask"][0].tolist() == [1] * 5 + [2] * 9 + [3] * 3 + [0] * 3
    assert b["position_ids"][0].tolist() == [*range(5), *range(9), *range(3), 0, 0, 0]
    assert b["attention_mask"][2].tolist() == [1] * 4 + [0] * 16
    # Each document's first token has no label: the token before it (another document's last)
    # is never asked to predict it. Every other real token is supervised; padding never is.
    firsts = [0, 5, 14]
    assert all(b["labels"][0, i] == IGNORE_INDEX for i in firsts)
    assert (b["labels"][0, 17:] == IGNORE_INDEX).all()
    assert supervised_tokens(torch.as_tensor(b["labels"])) == sum(DOC_LENS) - len(DOC_LENS)
    values, _ = _docs()
    assert np.array_equal(b["input_ids"][0, :17], values[:17])
    assert int(b["num_real_tokens"]) == sum(DOC_LENS) and int(b["num_documents"]) == 6


def test_packed_collate_keeps_a_loss_mask_and_refuses_an_overfull_row():
    values, offsets = _docs()
    mask = np.ones_like(values)
    mask[5:8] = 0  # doc 1's first three tokens unsupervised
    b = collate_packed(values, offsets, ROWS, row_tokens=ROW_TOKENS, loss_mask=mask)
    assert (b["labels"][0, 5:8] == IGNORE_INDEX).all() and b["labels"][0, 8] == values[8]
    with pytest.raises(ValueError, match="row_tokens=16"):
        collate_packed(values, offsets, ROWS, row_tokens=16)


def test_block_causal_mask_and_cu_seqlens_describe_the_documents():
    doc = torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.int32)
    m = block_causal_mask(doc)[0, 0]
    assert m[3].tolist() == [False, False, True, True, False, False]
    assert m[1].tolist() == [True, True, False, False, False, False]
    cu, longest = cu_seqlens(doc)
    assert cu.tolist() == [0, 2, 5, 6, 12] and longest == 6
    assert is_packed(doc) and not is_packed(torch.ones(2, 6, dtype=torch.long))


@pytest.mark.parametrize(
    "build", [_tiny, _llama, lambda: _llama("eager")], ids=["tiny", "llama-sdpa", "llama-eager"]
)
def test_packed_logits_equal_each_document_alone(build):
    model = build()
    with torch.no_grad():
        packed = _fwd(model, _packed_batch())
        for (r, a, b), one in zip(_packed_slices(), _one_doc_batches(), strict=True):
            alone = _fwd(model, one)[0, : b - a]
            torch.testing.assert_close(packed[r, a:b], alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("build", [_tiny, _llama], ids=["tiny", "llama"])
def test_packed_loss_and_gradients_equal_the_per_document_ones(build):
    model = build()
    b = _packed_batch()
    loss, correct = token_sums(_fwd(model, b), b["labels"])
    loss.backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    ref_loss, ref_correct = 0.0, 0
    for one in _one_doc_batches():
        l1, c1 = token_sums(_fwd(model, one), one["labels"])
        l1.backward()
        ref_loss, ref_correct = ref_loss + l1.detach(), ref_correct + int(c1)
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e-5, atol=1e-5)
    assert int(correct) == ref_correct
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(packed_grads[n], p.grad, rtol=1e-4, atol=1e-6)


def test_without_the_block_mask_sdpa_attends_across_documents():
    """Why the mask is passed: restarting position_ids alone do not stop SDPA attention from
    crossing into earlier documents of the row."""
    model = _llama()
    b = _packed_batch()
    plain = (b["attention_mask"] > 0).long()  # a padding mask: the documents are not separated
    with torch.no_grad():
        leaky = model(b["input_ids"], plain, b["position_ids"])
        doc1 = _fwd(model, _one_doc_batches()[1])[0]
    assert not torch.allclose(leaky[0, 5:14], doc1, atol=1e-4)


def test_a_model_that_does_not_declare_packed_support_is_refused():
    require_packed_support(_tiny())
    with pytest.raises(ValueError, match="supports_packed"):
        require_packed_support(torch.nn.Linear(2, 2))


def _random_docs(B, T, seed, pad_tail=True):
    """[B, T] int32 document numbers: random lengths from 1 (many single-token documents) to T,
    and a padding tail (0) on most rows."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(B):
        lens = []
        while sum(lens) < T:
            lens.append(int(rng.choice([1, 1, 2, rng.integers(1, T + 1)])))
        real = T - (int(rng.integers(0, T // 4)) if pad_tail else 0)
        row = np.concatenate([np.full(n, d + 1) for d, n in enumerate(lens)])[:real]
        rows.append(np.concatenate([row, np.zeros(T - real, dtype=row.dtype)]))
    return torch.as_tensor(np.stack(rows), dtype=torch.int32)


@pytest.mark.parametrize("one_node", [True, False], ids=["cpu-flash-node", "autograd-graph"])
@pytest.mark.parametrize("seed", range(4))
def test_grouped_attention_equals_the_block_mask_path_in_outputs_and_gradients(
    seed, one_node, monkeypatch
):
    if not one_node:  # the path a GPU in fp32, or attention dropout, takes
        monkeypatch.setattr(packed_attention, "_flash_cpu_usable", lambda qkv, p: False)
    B, H, T, D = 3, 2, 67, 8
    doc = _random_docs(B, T, seed)
    assert (doc == 0).any() and any(
        int(n) == 1 for n in torch.unique_consecutive(doc[0], return_counts=True)[1]
    )
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g, requires_grad=True) for _ in range(3))
    w = torch.randn(B, H, T, D, generator=g)
    out = grouped_document_attention(q, k, v, doc)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=block_causal_mask(doc))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _group_cost(shapes):
    return sum(
        n * (L * (L + 1) / 2 + grouping.COST_PER_SLOT * L) + grouping.COST_PER_CALL
        for n, L in shapes
    )


def test_length_groups_cover_every_token_once_at_no_more_cost_than_half_octave_classes():
    doc = _random_docs(4, 300, seed=7)
    groups = length_groups(doc)
    N = doc.numel()
    assert len(set(groups.place.tolist())) == N  # one own slot per token
    assert torch.equal(groups.gather[groups.place], torch.arange(N))  # each slot reads its token
    assert torch.equal(groups.own[groups.place], torch.arange(N))
    assert int((groups.own < N).sum()) == N  # every other slot is filler
    lens = torch.cat([torch.unique_consecutive(r, return_counts=True)[1] for r in doc])
    assert sum(n for n, _ in groups.shapes) == lens.numel()  # every document in one group
    causal = float((lens * (lens + 1) / 2).sum())
    paid = sum(n * L * (L + 1) / 2 for n, L in groups.shapes)
    assert causal <= paid < doc.shape[0] * 300 * 301 / 2  # below the rows' whole squares
    # Half-octave classes (lengths within sqrt(2) of each other) cost at least as much.
    cls = torch.ceil(2 * torch.log2(lens.double()) - 1e-9).long()
    octaves = [(int((cls == c).sum()), int(lens[cls == c].max())) for c in torch.unique(cls)]
    assert _group_cost(groups.shapes) <= _group_cost(octaves)


@pytest.mark.parametrize("seed", range(20))
def test_group_bounds_are_the_least_cost_split_of_the_sorted_lengths(seed):
    rng = np.random.default_rng(seed)
    lengths = np.unique(rng.integers(1, 400, int(rng.integers(1, 9))))
    counts = rng.integers(1, 6, lengths.size)
    ends = grouping._group_bounds(lengths, counts)
    assert ends[-1] == lengths.size and ends == sorted(set(ends))

    def cost(ends):
        starts = [0, *ends[:-1]]
        return _group_cost(
            [
                (int(counts[s:e].sum()), int(lengths[e - 1]))
                for s, e in zip(starts, ends, strict=True)
            ]
        )

    u = lengths.size  # every split of u sorted lengths into consecutive groups
    splits = [[j for j in range(1, u) if mask >> (j - 1) & 1] + [u] for mask in range(2 ** (u - 1))]
    assert cost(ends) == pytest.approx(min(cost(e) for e in splits))


def test_the_tiny_decoder_on_cpu_never_builds_a_row_square_mask(monkeypatch):
    def refuse(doc):
        raise AssertionError("the CPU path built a [T, T] mask")

    monkeypatch.setattr(packed_attention, "block_causal_mask", refuse)
    model = _tiny()
    with torch.no_grad():
        packed = _fwd(model, _packed_batch())
    alone = _fwd(model, _one_doc_batches()[1])[0]
    torch.testing.assert_close(packed[0, 5:14], alone.detach(), rtol=1e-4, atol=1e-5)


def test_the_documents_are_described_once_per_forward_not_once_per_layer(monkeypatch):
    calls = []
    real = packed_attention.length_groups
    monkeypatch.setattr(packed_attention, "length_groups", lambda d: calls.append(1) or real(d))
    model = _tiny()
    assert len(model.blocks) == 2
    b = _packed_batch()
    loss, _ = token_sums(_fwd(model.train(), b), b["labels"])
    loss.backward()
    assert len(calls) == 1


def _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), **kw):
    """What torch's flash varlen_attn computes, on CPU: each [cu[i], cu[i+1]) slice of the
    flattened tokens is one sequence; window (-1, 0) is causal."""
    assert window_size == (-1, 0) and torch.equal(cu_q, cu_k) and max_q == max_k and not kw
    assert cu_q.dtype == torch.int32 and int(cu_q[-1]) == q.shape[0]
    assert max_q == int((cu_q[1:] - cu_q[:-1]).max())
    out = torch.empty_like(q)
    for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
        s = (x[a:b].transpose(0, 1) for x in (q, k, v))  # [H, n, D]
        out[a:b] = F.scaled_dot_product_attention(*s, is_causal=True).transpose(0, 1)
    return out


def test_the_varlen_call_hands_the_kernel_the_documents_it_expects(monkeypatch):
    """The CUDA path's plumbing on CPU: the tokens flattened as [B * T, H, D], cu_seqlens over
    the documents, causal window; run through a reference of the kernel, the tiny decoder's
    packed logits equal its grouped path's (tests/gpu runs the real kernel)."""
    from torch.nn.attention import varlen

    model = _tiny()
    b = _packed_batch()
    with torch.no_grad():
        grouped = _fwd(model, b)
        monkeypatch.setattr(varlen, "varlen_attn", _reference_varlen)
        monkeypatch.setattr(packed_attention, "varlen_usable", lambda q, p: True)
        through_varlen = _fwd(model, b)
        doc = b["attention_mask"]
        q, k, v = (torch.randn(doc.shape[0], 3, doc.shape[1], 4) for _ in range(3))
        out = packed_attention.document_attention(q, k, v, doc)
    torch.testing.assert_close(through_varlen, grouped, rtol=1e-5, atol=1e-6)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=block_causal_mask(doc))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
