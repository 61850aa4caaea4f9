"""The chunked loss's backward writes every chunk's gradient into one [tokens, vocab] gradient:
no full-size tensor per chunk (sliced autograd zero-fills one per chunk and adds them up), and
the gradient is the unchunked loss's, IGNORE_INDEX rows and the caller's loss scale included."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pipeline.core.collate import IGNORE_INDEX
from pipeline.learn.loss import token_sums

B, L, V = 4, 32, 50  # 128 positions: 8 chunks of 16


class FullSizeAllocations(TorchDispatchMode):
    """Records every op whose output is a new tensor (not a view or in-place result of one of
    its inputs) of at least `numel` elements."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel = numel
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if (
                isinstance(t, torch.Tensor)
                and t.numel() >= self.numel
                and t.untyped_storage().data_ptr() not in inputs
            ):
                self.ops.append(str(func))
        return out


def _batch(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, L, V, generator=g).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (B, L), generator=g)
    labels[0, 20:] = IGNORE_INDEX  # padding: rows without a loss
    labels[2, :5] = IGNORE_INDEX  # a prompt: unsupervised positions inside a row
    return logits, labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_backward_allocates_one_full_size_gradient(dtype):
    logits, labels = _batch(0, dtype)
    loss, _ = token_sums(logits, labels, chunk_tokens=16)
    seen = FullSizeAllocations(B * L * V)
    with seen:
        loss.backward()
    assert len(seen.ops) == 1, seen.ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_gradient_is_the_unchunked_gradient_with_ignored_rows_and_a_scale(dtype):
    logits, labels = _batch(1, dtype)
    scale = torch.tensor(0.37, dtype=torch.float64)  # as the step scales the sum on the device
    full, full_correct = token_sums(logits, labels, chunk_tokens=10**9)
    (g_full,) = torch.autograd.grad(full * scale.to(full.dtype), logits)
    chunked, chunked_correct = token_sums(logits, labels, chunk_tokens=16)
    (g_chunked,) = torch.autograd.grad(chunked * scale.to(chunked.dtype), logits)
    assert chunked.dtype == full.dtype == torch.float32
    assert chunked.item() == pytest.approx(full.item(), rel=1e-6)
    assert int(chunked_correct) == int(full_correct)
    assert g_chunked.dtype == dtype
    # Each row's gradient comes from the same kernels as the unchunked loss's: equal bit for bit.
    assert torch.equal(g_chunked, g_full)
    ignored = torch.full_like(labels, IGNORE_INDEX)
    ignored[:, :-1] = labels[:, 1:]
    assert not g_chunked[ignored == IGNORE_INDEX].any()


def test_a_chunked_loss_without_a_gradient_keeps_nothing_for_backward():
    logits, labels = _batch(2, torch.bfloat16)
    with torch.no_grad():
        loss, correct = token_sums(logits, labels, chunk_tokens=16)
    ref, ref_correct = token_sums(logits.detach(), labels, chunk_tokens=10**9)
    assert loss.grad_fn is None
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6) and int(correct) == int(ref_correct)
