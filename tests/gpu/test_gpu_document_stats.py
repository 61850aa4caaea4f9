"""The step's per-token losses and per-document sums on the GPU (what each step's sampling
variance is computed from): bf16 logits, chunked, on CUDA, equal to the same sums on the CPU in
fp32 (scatter and index_add in float64 on the device; no host read inside).
Skipped without a CUDA GPU; run by scripts/gpu_check.sh on a GPU machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.core.packed_collate import collate_packed
from pipeline.learn.loss import token_sums
from pipeline.learn.range_loss import document_stats

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

VOCAB = 512


def _packed_batch():
    rng = np.random.default_rng(3)
    lengths = rng.integers(2, 200, 96)
    values = rng.integers(0, VOCAB, int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rows = np.arange(0, lengths.size + 1, 4)
    out = collate_packed(values, offsets, rows, row_tokens=1024)
    return {k: torch.from_numpy(np.asarray(out[k])) for k in ("labels", "attention_mask")}


@pytest.mark.parametrize("bounds", [None, [64.0, 128.0]])
def test_document_stats_on_cuda_equal_the_cpu_sums(bounds):
    x = _packed_batch()
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(*x["labels"].shape, VOCAB, generator=g)
    G = 1 if bounds is None else len(bounds) + 1
    b_cpu = None if bounds is None else torch.tensor(bounds, dtype=torch.float64)
    _, _, per = token_sums(logits, x["labels"], per_token=True)
    want = document_stats(per, x["labels"], x["attention_mask"], b_cpu, G)

    dev = torch.device("cuda")
    lg = logits.to(dev, torch.bfloat16).requires_grad_()
    loss, _, per_d = token_sums(lg, x["labels"].to(dev), per_token=True, chunk_tokens=4096)
    loss.backward()  # the training path: the per-token losses come from this forward
    b_dev = None if b_cpu is None else b_cpu.to(dev)
    got = document_stats(per_d, x["labels"].to(dev), x["attention_mask"].to(dev), b_dev, G)
    got = got.cpu()
    assert got.shape == want.shape == (6, G)
    torch.testing.assert_close(got[1:3], want[1:3], rtol=0, atol=0)  # tokens, documents
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=0)  # bf16 logits: loose
    torch.testing.assert_close(got[3:], want[3:], rtol=4e-2, atol=0)
    assert float(got[2].sum()) == 96 and lg.grad is not None
