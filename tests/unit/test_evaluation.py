"""Contract 11, exact held-out evaluation: every held-out sample once per evaluation on exactly one
rank, whatever the world size; the same figures on 1, 2 or many ranks; padded and packed layouts
agree, and each document is evaluated as if it were alone. No Ray: ranks are simulated."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.collate import IGNORE_INDEX
from pipeline.core.evaluation import EvalSums, eval_plan, eval_subset
from pipeline.core.packing import PackingSpec
from pipeline.data.evalset import EvalSet, rank_eval_batches
from pipeline.learn.evaluate import document_sums
from pipeline.learn.factory import build_model
from pipeline.train.evaluation import evaluate_batches
from tests.helpers import tiny_config

TOP = 64
EDGES = [0, 16, 40, TOP]
SPEC = PackingSpec(row_tokens=TOP, rows_per_step=4, attention_width=192, open_rows=4)


def _lengths(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, TOP + 1, n)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    world=st.integers(1, 64),
    budget=st.integers(TOP, 8 * TOP),
    packed=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_contract11_every_held_out_sample_is_evaluated_once_on_exactly_one_rank(
    n, world, budget, packed, seed
):
    lengths = _lengths(n, seed)
    ids = np.sort(np.random.default_rng(seed).choice(10**9, n, replace=False))
    plan = eval_plan(
        lengths,
        ids,
        top=TOP,
        world_size=world,
        token_budget=budget,
        packing=SPEC if packed else None,
    )
    seen = np.concatenate([plan.rank_view(r).sample_ids for r in range(world)])
    assert np.array_equal(np.sort(seen), ids)  # none twice, none dropped, ranks with none fine


def test_eval_subset_is_a_fixed_draw_whatever_the_order_of_the_ids():
    ids = np.arange(1000) * 3 + 7
    a = eval_subset(ids, 100)
    assert a.size == 100 and np.array_equal(a, eval_subset(ids, 100))
    shuffled = np.random.default_rng(0).permutation(ids)
    assert set(ids[a]) == set(shuffled[eval_subset(shuffled, 100)])
    assert np.array_equal(eval_subset(ids, None), np.arange(1000))


def _model(seed: int = 0):
    cfg = tiny_config(model={"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 2})
    torch.manual_seed(seed)
    return build_model(cfg.model, max_positions=TOP)


def _eval_set(n: int, seed: int, loss_mask: bool = False) -> EvalSet:
    rng = np.random.default_rng(seed)
    lengths = _lengths(n, seed)
    ids = np.sort(rng.choice(10**6, n, replace=False))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = rng.integers(3, 64, int(offsets[-1])).astype(np.int32)
    cols = {
        "sample_id": pa.array(ids, pa.int64()),
        "input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)),
    }
    if loss_mask:
        mask = (rng.random(values.size) < 0.5).astype(np.int8)
        cols["sup"] = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(mask))
    return EvalSet(
        path="mem",
        sample_ids=ids,
        lengths=lengths.astype(np.int64),
        table=pa.table(cols),
        supervision="loss_mask" if loss_mask else "",
    )


def _run_cfg(packed: bool, budget: int = 4 * TOP):
    batching = (
        {"mode": "packed", "row_tokens": TOP, "rows_per_step": 12}
        if packed
        else {"token_budget": budget}
    )
    return tiny_config(
        data={"max_length": TOP},
        buckets={"edges": EDGES},
        batching=batching,
        model={"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 2},
        scaling={"num_workers": 1},
        eval={"path": "unused", "token_budget": budget},
    )


def _figures(model, eval_set: EvalSet, world: int, packed: bool) -> dict[str, float]:
    """The figures of `world` simulated ranks: each rank's sums, added as the all-reduce does."""
    cfg = _run_cfg(packed)
    total = EvalSums.zeros(len(EDGES) - 1)
    for r in range(world):
        batches = rank_eval_batches(cfg, eval_set, top=TOP, rank=r, world_size=world)
        total = total + evaluate_batches(model, batches(), edges=EDGES, device=torch.device("cpu"))
    return total.metrics()


@pytest.mark.parametrize("loss_mask", [False, True])
def test_contract11_the_same_figures_on_any_world_size_padded_or_packed(loss_mask):
    model, held = _model(), _eval_set(150, seed=3, loss_mask=loss_mask)
    ref = _figures(model, held, 1, packed=False)
    assert ref["eval/samples"] > 0 and ref["eval/tokens"] > 0
    for world, packed in [(2, False), (3, False), (7, False), (1, True), (2, True), (4, True)]:
        got = _figures(model, held, world, packed)
        assert got.keys() == ref.keys()
        for k, v in ref.items():
            assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), (k, world, packed)


def test_contract11_each_document_is_evaluated_as_if_alone_and_loss_masks_are_respected():
    model, held = _model(1), _eval_set(12, seed=4, loss_mask=True)
    want_loss, want_tokens = 0.0, 0
    for i in range(held.num_samples):
        toks = torch.tensor(held.table["input_ids"][i].as_py())[None]
        mask = torch.tensor(held.table["sup"][i].as_py())[None]
        labels = torch.where(mask > 0, toks, torch.full_like(toks, IGNORE_INDEX))
        with torch.no_grad():
            logits = model(toks, torch.ones_like(toks), torch.arange(toks.shape[1])[None])
        loss, _, tokens, length = document_sums(logits, labels, torch.ones_like(toks))
        assert length.tolist() == [toks.shape[1]]
        want_loss += float(loss.sum())
        want_tokens += int(tokens.sum())
    for packed in (False, True):
        got = _figures(model, held, 2, packed)
        assert got["eval/tokens"] == want_tokens
        assert got["eval/loss"] == pytest.approx(want_loss / want_tokens, rel=1e-5)


def test_loss_by_bucket_weighs_tokens_and_per_sample_loss_weighs_samples():
    loss = np.array([10.0, 2.0, 30.0])
    tokens = np.array([10.0, 1.0, 10.0])
    s = EvalSums.of_documents(loss, np.array([5.0, 1, 2]), tokens, np.array([12, 3, 50]), EDGES)
    m = s.metrics()
    assert m["eval/loss"] == pytest.approx(42 / 21)
    assert m["eval/loss_per_sample"] == pytest.approx((1.0 + 2.0 + 3.0) / 3)
    assert m["eval/accuracy"] == pytest.approx(8 / 21)
    assert m["eval/loss_by_bucket/0"] == pytest.approx(12 / 11)  # lengths 12 and 3: (0, 16]
    assert "eval/loss_by_bucket/1" not in m  # no held-out sample of (16, 40]
    assert m["eval/loss_by_bucket/2"] == pytest.approx(3.0)
    again = EvalSums.from_vector(s.vector(), 3)
    assert again.metrics() == m


@pytest.mark.parametrize(
    "eval_section, data, message",
    [
        ({}, {}, "give exactly one held-out source"),
        ({"path": "a", "split": "validation"}, {}, "give exactly one held-out source"),
        ({"path": " "}, {}, "eval.path is empty"),
        (
            {"path": "a", "at_epoch_end": False, "at_end": False},
            {},
            "no evaluation would ever run",
        ),
        ({"split": "validation"}, {}, "the synthetic corpus has no held-out split"),
        ({"split": "train"}, {"path": "d", "split": "train"}, "is the training split"),
    ],
)
def test_an_eval_section_that_cannot_work_is_one_line_naming_the_fix(eval_section, data, message):
    from pipeline.core.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        tiny_config(eval=eval_section, data=data)


def test_the_synthetic_text_corpus_holds_out_whole_source_files():
    from pipeline.data.textcorpus import heldout_files

    files = [f"pkg/mod{i}.py" for i in range(2000)]
    held = heldout_files(files, 0.07)
    assert 0.05 < len(held) / len(files) < 0.09
    assert held == heldout_files(list(reversed(files)), 0.07)  # by path, not by position
    assert heldout_files(files, 0.0) == set()
    cfg = tiny_config(
        data={"synthetic": {"preset": "pystdlib", "heldout": 0.07}},
        eval={"split": "validation"},
    )
    assert cfg.eval.split == "validation"
