"""The training loss by document length range: the ranges, the device-side sums, the step's one
synchronisation, and the history that keeps them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pipeline.core.buckets import assign
from pipeline.core.collate import collate
from pipeline.core.length_ranges import report_ranges, run_ranges
from pipeline.core.packed_collate import collate_packed
from pipeline.learn.evaluate import document_sums
from pipeline.learn.loss import token_sums
from pipeline.learn.range_loss import document_lengths, document_stats
from pipeline.train.history import StepHistory
from tests.unit import trainer_fixtures
from tests.unit.test_step_syncs import _counted_run


def _packed(rng, lengths, per_row, row_tokens=64):
    values = rng.integers(0, 32, int(np.sum(lengths)))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rows = np.arange(0, len(lengths) + 1, per_row)
    if rows[-1] != len(lengths):
        rows = np.append(rows, len(lengths))
    out = collate_packed(values, offsets, rows, row_tokens=row_tokens)
    return {k: torch.from_numpy(np.asarray(out[k])) for k in ("labels", "attention_mask")}


def _padded(rng, lengths):
    values = rng.integers(0, 32, int(np.sum(lengths)))
    out = collate(values, np.concatenate([[0], np.cumsum(lengths)]), upper=max(lengths))
    return {k: torch.from_numpy(np.asarray(out[k])) for k in ("labels", "attention_mask")}


def test_report_ranges_cut_the_lengths_into_a_few_ranges_up_to_the_top_edge():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(5, 60, 500), rng.integers(200, 900, 60)])
    edges = report_ranges(lengths, top=1024)
    assert edges[0] == 0 and edges[-1] == 1024 and len(edges) == 5
    assert np.all(np.diff(edges) > 0)
    counts = np.bincount(assign(np.minimum(lengths, 1024), edges), minlength=4)
    assert (counts > 0).all()
    assert report_ranges(np.full(50, 37), top=64) == [0, 64]  # one length: one range
    assert report_ranges(np.array([], dtype=int), top=64) == []


def test_only_a_run_without_buckets_reports_ranges():
    lengths = np.arange(1, 300)
    assert len(run_ranges(lengths, [0, 299])) == 5
    assert run_ranges(lengths, [0, 100, 299]) == []


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("edges", [[0, 6, 12, 20, 30], None])
def test_document_stats_sum_each_documents_loss_and_tokens_in_its_range(packed, edges):
    """Per range (or over the micro-batch): the loss and tokens, and over documents their count
    and the sums of S^2, S*n and n^2, against the held-out path's per-document sums."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(2, 30, 14)
    x = _packed(rng, lengths, per_row=3) if packed else _padded(rng, lengths)
    logits = torch.randn(*x["labels"].shape, 32, dtype=torch.float32)
    S, _, n, length = document_sums(logits, x["labels"], x["attention_mask"])
    G = 4 if edges else 1
    r = assign(length, edges) if edges else np.zeros(len(S), int)
    has = n > 0
    want = [
        np.bincount(r, weights=S, minlength=G),
        np.bincount(r, weights=n, minlength=G),
        np.bincount(r[has], minlength=G),
        np.bincount(r, weights=S * S, minlength=G),
        np.bincount(r, weights=S * n, minlength=G),
        np.bincount(r, weights=n * n, minlength=G),
    ]
    _, _, per = token_sums(logits, x["labels"], per_token=True, chunk_tokens=37)
    bounds = torch.tensor(edges[1:-1], dtype=torch.float64) if edges else None
    got = document_stats(per, x["labels"], x["attention_mask"], bounds, G).numpy()
    assert got.shape == (6, G)
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-6)
    assert got[2].sum() == has.sum() >= 12  # every document with a supervised token, once
    np.testing.assert_array_equal(got[1], want[1])  # supervised tokens: exact
    assert (got[1] > 0).sum() >= (3 if edges else 1)  # the documents span the ranges


def test_document_lengths_follow_the_mask_numbers_within_each_row():
    mask = torch.tensor([[1, 1, 2, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.int32)
    want = [[2, 2, 3, 3, 3, 1, 0, 0], [7, 7, 7, 7, 7, 7, 7, 0]]
    assert document_lengths(mask).tolist() == want


def _with_ranges(monkeypatch, ranges):
    plain = trainer_fixtures.spec

    def spec(*a, **kw):
        return dataclasses.replace(plain(*a, **kw), ranges=ranges)

    monkeypatch.setattr(trainer_fixtures, "spec", spec)


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_the_loss_by_range_rides_the_steps_one_synchronisation(tmp_path, monkeypatch, grad_accum):
    ranges = [0, 8, 16, 32]
    _with_ranges(monkeypatch, ranges)
    reads, what, t = _counted_run(tmp_path, grad_accum=grad_accum)
    assert reads.max() <= 1 and reads.sum() == len(reads), (reads.tolist(), what)
    h = t.history.arrays()
    assert t.history.range_edges == ranges
    loss, tokens = h["range_loss"], h["range_tokens"]
    assert loss.shape == (t.steps_done, 3) and (tokens > 0).any(axis=0).all()
    # Every supervised token lies in one range: the ranges add up to the step's loss.
    # (The step loss is an fp32 sum, the ranges fp64 sums of the same fp32 token losses.)
    np.testing.assert_allclose(loss.sum(1) / tokens.sum(1), h["loss"], rtol=1e-6)


def test_a_history_keeps_its_ranges_through_a_checkpoint_and_a_truncation(tmp_path):
    h = StepHistory(range_edges=[0, 10, 20])
    row = dict(epoch=0, bucket=0, loss=1.0, debiased=1.0, lr=0.1, real=5.0, padded=8.0)
    for s in range(1, 5):
        h.append(step=s, seconds=0.1, range_loss=[s, 2.0 * s], range_tokens=[3.0, 4.0], **row)
    h.write(str(tmp_path))
    back = StepHistory.read_dir(str(tmp_path))
    assert back.range_edges == [0, 10, 20]
    np.testing.assert_array_equal(back.arrays()["range_loss"], h.arrays()["range_loss"])
    back.truncate(2)
    assert back.arrays()["range_tokens"].shape == (2, 2)
    plain = StepHistory()
    plain.append(step=1, seconds=0.1, **row)
    plain.write(str(tmp_path))
    assert StepHistory.read_dir(str(tmp_path)).range_edges == []
    assert "range_loss" not in StepHistory.read_dir(str(tmp_path)).arrays()


def _ranged_history(steps: int = 40) -> StepHistory:
    """Packed steps: one bucket, four length ranges whose losses differ by a fixed offset."""
    rng = np.random.default_rng(2)
    h = StepHistory(range_edges=[0, 60, 150, 300, 512])
    for s in range(1, steps + 1):
        tok = rng.integers(500, 6000, 4).astype(float)
        per = 2.0 + np.exp(-s / 10) + np.array([0.4, 0.1, -0.1, -0.2])
        loss = float((per * tok).sum() / tok.sum())
        h.append(step=s, epoch=0, bucket=0, loss=loss, debiased=loss, lr=1e-3, real=tok.sum(),
                 padded=16384.0, seconds=0.5, range_loss=per * tok, range_tokens=tok)  # fmt: skip
    return h


def test_a_packed_picture_draws_the_length_ranges_never_the_one_bucket_panel(tmp_path, monkeypatch):
    from pipeline.train import run_picture

    drawn = {}
    monkeypatch.setattr(
        run_picture, "_draw_bucket_losses", lambda *a, **k: drawn.setdefault("buckets", 1)
    )
    real = run_picture.draw_range_losses
    monkeypatch.setattr(
        run_picture,
        "draw_range_losses",
        lambda ax, a, edges, cmap: drawn.setdefault("ranges", edges) and real(ax, a, edges, cmap),
    )
    h = _ranged_history()
    run_picture.draw_history(h, str(tmp_path / "run.png"), edges=[0, 512])
    assert drawn == {"ranges": [0, 60, 150, 300, 512]}
    lines = run_picture._summary_lines(h.arrays(), None, 1, [0, 512], h.range_edges)
    text = "\n".join(lines)
    assert "one bucket" not in text
    for label in ("1-60 tok 2.4", "61-150 tok 2.1", "151-300 tok 1.9", "301-512 tok 1.8"):
        assert label in text, text
