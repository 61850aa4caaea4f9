"""Contract 9, honest loss: one mean over every supervised token of the global step, on any
number of ranks, with empty micro-batches joining every collective at zero weight."""

import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from pipeline.core.collate import IGNORE_INDEX, collate
from pipeline.core.config import ModelConfig
from pipeline.data.rechunk import MicroBatch
from pipeline.learn.factory import build_model
from pipeline.learn.loss import ddp_loss_scale, supervised_tokens, token_sums
from pipeline.train.step import train_group

CFG = ModelConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, d_ff=32)


def micro_batch(rows: list[list[int]], step: int = 0) -> MicroBatch:
    if not rows:
        z = torch.zeros(0, 0, dtype=torch.int64)
        return MicroBatch(0, step, 0, np.zeros(0, np.int64), z, z, z, z, 0, 0)
    lens = [len(r) for r in rows]
    out = collate(np.concatenate(rows), np.concatenate([[0], np.cumsum(lens)]), upper=64)
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in out.items()}
    return MicroBatch(
        0,
        step,
        0,
        np.arange(len(rows)),
        t["input_ids"],
        t["attention_mask"],
        t["labels"],
        t["position_ids"],
        int(out["num_real_tokens"]),
        int(out["num_padded_tokens"]),
    )


def _rows(seed: int, n: int, lo: int = 3, hi: int = 12) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, CFG.vocab_size, rng.integers(lo, hi)).tolist() for _ in range(n)]


def test_token_sums_shift_labels_and_count_supervised_only():
    mb = micro_batch([[1, 2, 3, 4], [5, 6]])
    logits = torch.zeros(2, mb.input_ids.shape[1], CFG.vocab_size)
    loss_sum, correct = token_sums(logits, mb.labels)
    # 3 + 1 predicted tokens, uniform logits: each costs ln(V).
    assert supervised_tokens(mb.labels) == 4
    assert loss_sum.item() == pytest.approx(4 * np.log(CFG.vocab_size))
    assert correct.item() == 0


def test_contract9_split_sums_over_global_count_equal_the_full_batch_mean():
    """Sums per micro-batch divided by the global token count is the token mean of the whole
    step, however unevenly the tokens are split (a mean of means would not be)."""
    torch.manual_seed(0)
    model = build_model(CFG, 64).eval()
    rows = _rows(1, 5, 2, 20)
    full = micro_batch(rows)
    fl = model(full.input_ids, full.attention_mask, full.position_ids)
    mean = torch.nn.functional.cross_entropy(
        fl[:, :-1].reshape(-1, CFG.vocab_size),
        full.labels[:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
    )
    parts = [micro_batch(rows[:1]), micro_batch(rows[1:])]
    total = sum(supervised_tokens(p.labels) for p in parts)
    sums = [
        token_sums(model(p.input_ids, p.attention_mask, p.position_ids), p.labels)[0] for p in parts
    ]
    assert (sum(sums) / total).item() == pytest.approx(mean.item(), rel=1e-5)


def test_contract9_empty_micro_batch_contributes_zero_but_touches_every_parameter():
    torch.manual_seed(0)
    model = build_model(CFG, 64)
    stats = train_group(model, [micro_batch([])], device=torch.device("cpu"), world_size=1)
    assert stats.loss_sum[0] == 0 and stats.tokens[0] == 0 and stats.samples[0] == 0
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def _ddp_worker(rank: int, world: int, store: str, groups: list, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(CFG, 64))
    mbs = [micro_batch(g[rank], step=i) for i, g in enumerate(groups)]
    stats = train_group(model, mbs, device=torch.device("cpu"), world_size=world)
    if rank == 0:
        torch.save(
            {
                "grads": [p.grad.clone() for p in model.module.parameters()],
                "loss_sum": stats.loss_sum,
                "tokens": stats.tokens,
            },
            out,
        )
    dist.barrier()  # rank 0's file is written before either rank tears gloo down
    dist.destroy_process_group()
    # gloo's threads can abort the interpreter's exit ("terminate called without an active
    # exception", SIGABRT) after the work is done: leave without running the exit handlers.
    os._exit(0)


def test_contract9_ddp_gradient_is_the_gradient_of_the_global_token_mean():
    """2 gloo ranks, 2 accumulated global steps, rank 1 empty at the second: the DDP gradient
    equals the single-process gradient of (all token losses) / (all supervised tokens)."""
    step0 = [_rows(2, 3), _rows(3, 1, 2, 4)]  # rank 0: 3 rows, rank 1: 1 short row
    step1 = [_rows(4, 2), []]  # rank 1 empty
    groups = [step0, step1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.pt")
        mp.spawn(_ddp_worker, args=(2, os.path.join(d, "store"), groups, out), nprocs=2, join=True)
        got = torch.load(out, weights_only=False)

    torch.manual_seed(0)
    ref = build_model(CFG, 64)
    loss, count = 0.0, 0
    for g in groups:
        for rows in g:
            if rows:
                mb = micro_batch(rows)
                s, _ = token_sums(ref(mb.input_ids, mb.attention_mask, mb.position_ids), mb.labels)
                loss, count = loss + s, count + supervised_tokens(mb.labels)
    (loss / count).backward()
    for g_ddp, p in zip(got["grads"], ref.parameters(), strict=True):
        torch.testing.assert_close(g_ddp, p.grad, rtol=1e-4, atol=1e-6)
    assert got["tokens"].sum() == count
    assert got["loss_sum"].sum() == pytest.approx(float(loss.detach()), rel=1e-5)


def test_ddp_scale_undoes_gradient_averaging():
    assert ddp_loss_scale(100, 4) == pytest.approx(0.04)
    assert ddp_loss_scale(0, 2) == 2.0  # no supervised token anywhere: loss is 0 anyway


def test_chunked_loss_equals_the_unchunked_loss_and_gradient():
    """The fp32 cross-entropy in checkpointed chunks: same sum, same count, same gradient."""
    torch.manual_seed(0)
    mb = micro_batch(_rows(5, 6, 2, 30))
    logits = torch.randn(*mb.input_ids.shape, CFG.vocab_size, requires_grad=True)
    full, full_correct = token_sums(logits, mb.labels, chunk_tokens=10**9)
    (g_full,) = torch.autograd.grad(full, logits)
    chunked, chunked_correct = token_sums(logits, mb.labels, chunk_tokens=7)
    (g_chunked,) = torch.autograd.grad(chunked, logits)
    assert chunked.item() == pytest.approx(full.item(), rel=1e-6)
    assert chunked_correct == full_correct
    torch.testing.assert_close(g_chunked, g_full)


@pytest.mark.parametrize("chunk", [10**9, 7])
def test_per_token_losses_come_from_the_training_forward_with_the_same_sum_and_gradient(chunk):
    """`per_token=True` keeps each position's loss (0 where unsupervised) from the forward that
    trains, chunked or not; the loss and its gradient are the plain call's."""
    torch.manual_seed(1)
    mb = micro_batch(_rows(5, 6, 2, 30))
    logits = torch.randn(*mb.input_ids.shape, CFG.vocab_size, requires_grad=True)
    plain, _ = token_sums(logits, mb.labels, chunk_tokens=chunk)
    (g_plain,) = torch.autograd.grad(plain, logits)
    loss, _, per = token_sums(logits, mb.labels, chunk_tokens=chunk, per_token=True)
    (g,) = torch.autograd.grad(loss, logits)
    target = torch.full_like(mb.labels, -100)
    target[:, :-1] = mb.labels[:, 1:]
    want = torch.nn.functional.cross_entropy(
        logits.detach().reshape(-1, CFG.vocab_size), target.reshape(-1), reduction="none"
    )
    assert not per.requires_grad and per.shape == (mb.labels.numel(),)
    torch.testing.assert_close(per, want)
    assert (per[target.reshape(-1) == -100] == 0).all() and (per > 0).sum() > 10
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)
    torch.testing.assert_close(g, g_plain)


def test_bf16_logits_are_upcast_one_chunk_at_a_time(monkeypatch):
    """The loss never holds a [tokens, vocab] fp32 copy: each cross-entropy call sees at most
    chunk_tokens rows, in forward and in the recomputation of backward."""
    import pipeline.learn.loss as loss_mod

    rows_seen = []
    ce = loss_mod.F.cross_entropy

    def spy(x, *a, **kw):
        rows_seen.append(x.shape[0])
        return ce(x, *a, **kw)

    monkeypatch.setattr(loss_mod.F, "cross_entropy", spy)
    mb = micro_batch(_rows(6, 4, 20, 30))
    logits = torch.randn(*mb.input_ids.shape, CFG.vocab_size, dtype=torch.bfloat16)
    loss, _ = token_sums(logits.requires_grad_(), mb.labels, chunk_tokens=16)
    loss.backward()
    n = mb.input_ids.numel()
    assert max(rows_seen) == 16 and sum(rows_seen) == 2 * n  # forward + recomputed backward
