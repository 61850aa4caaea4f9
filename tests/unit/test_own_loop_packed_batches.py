"""The own-loop calls on packed micro-batches, without Ray: `batch_tensors` hands the tiny decoder
the document-numbered rows, `next_token_loss` over them is the documents' loss taken one by one,
and an empty packed share still yields a loss with a gradient (tests/ray/test_own_loop_packed.py
runs the same calls on a feeder's packed epoch)."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.core.collate import collate
from pipeline.core.config import ModelConfig
from pipeline.core.packed_collate import collate_packed
from pipeline.data import api
from pipeline.learn.factory import build_model
from pipeline.learn.packed_attention import is_packed

LENS = [7, 1, 12, 5, 9]
ROWS = [0, 3, 5]  # row 0: 20 tokens, row 1: 14
T = 24


def _micro_batch(batch: dict, ids) -> api.MicroBatch:
    t = {k: torch.as_tensor(v) for k, v in batch.items() if np.ndim(v) == 2}
    return api.MicroBatch(
        epoch=0,
        step=0,
        bucket=0,
        sample_ids=np.asarray(ids),
        num_real_tokens=int(batch["num_real_tokens"]),
        num_padded_tokens=int(batch["num_padded_tokens"]),
        **t,
    )


def test_next_token_loss_on_a_packed_micro_batch_is_the_documents_loss_one_by_one():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 64, sum(LENS)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(LENS)])
    mb = _micro_batch(collate_packed(values, offsets, ROWS, row_tokens=T), range(len(LENS)))
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64), T)
    x = api.batch_tensors(mb)
    assert is_packed(x["attention_mask"])
    total, count = 0.0, 0
    with torch.no_grad():
        packed = api.next_token_loss(
            model(x["input_ids"], x["attention_mask"], x["position_ids"]), x["labels"]
        )
        for a, b in zip(offsets[:-1], offsets[1:], strict=True):
            one = api.batch_tensors(_micro_batch(collate(values[a:b], [0, b - a], upper=T), [0]))
            n = b - a - 1  # supervised next-token targets of the document
            if n:
                logits = model(one["input_ids"], one["attention_mask"], one["position_ids"])
                total += float(api.next_token_loss(logits, one["labels"])) * n
                count += n
    torch.testing.assert_close(float(packed), total / count, rtol=1e-5, atol=1e-6)


def test_an_empty_packed_share_gives_the_tiny_decoder_a_zero_loss_with_a_gradient():
    empty = collate_packed(np.zeros(0, np.int32), [0], [0], row_tokens=T)
    x = api.batch_tensors(_micro_batch(empty, []))
    model = build_model(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, d_ff=64), T)
    loss = api.next_token_loss(
        model(x["input_ids"], x["attention_mask"], x["position_ids"]), x["labels"]
    )
    loss.backward()  # the rank still joins DDP's all-reduce
    assert float(loss.detach()) == 0.0 and model.head.weight.grad is not None
