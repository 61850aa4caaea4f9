"""The own-loop API (pipeline.data.api) with batching.mode=packed: every rank gets its share of
each step's packed rows, every planned sample arrives once, and a loop of its own trains the tiny
decoder on them through `batch_tensors` and `next_token_loss`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.core.config import validate
from pipeline.core.epochs import epoch_plan_for
from pipeline.data import api, build_length_index
from pipeline.learn.factory import build_model
from pipeline.learn.packed_attention import is_packed
from tests.helpers import tiny_raw

pytestmark = pytest.mark.ray

ROW_TOKENS, ROWS_PER_STEP, WORLD = 256, 4, 2  # rows of ~4 of the 64-token samples


# A feeder and one epoch through it in this process, on the session's shared cluster (~5 s of
# call): the default suite. tests/unit/test_own_loop_packed_batches.py checks the same calls on
# packed micro-batches without Ray.
def test_own_loop_trains_the_tiny_decoder_on_packed_rows_every_planned_sample_once(
    cluster, tmp_path
):
    cfg = validate(
        tiny_raw(
            tmp_path,
            batching={"mode": "packed", "row_tokens": ROW_TOKENS, "rows_per_step": ROWS_PER_STEP},
            buckets={"num_buckets": "auto"},  # packed: one bucket, a full shuffle
            train={"epochs": 1},
        )
    )
    delivery = api.prepare_delivery(cfg, name="own-loop-packed-feeder")
    try:
        ranks = [list(api.iter_run(delivery, rank=r, world_size=WORLD)) for r in range(WORLD)]
    finally:
        api.stop_delivery(delivery)

    # Every rank has one micro-batch per planned step, the plan's rows, and every sample once.
    plan = epoch_plan_for(cfg, build_length_index(cfg, delivery.path), delivery.edges, 0, WORLD)
    assert [len(r) for r in ranks] == [plan.num_steps] * WORLD == [delivery.total_steps] * WORLD
    ids = np.concatenate([mb.sample_ids for r in ranks for mb in r])
    assert ids.size == delivery.num_samples == np.unique(ids).size
    for r, got in enumerate(ranks):  # each rank's share of each step, as planned
        view = plan.rank_view(r)
        planned = np.split(view.sample_ids, view.offsets[1:-1])
        assert [mb.sample_ids.tolist() for mb in got] == [p.tolist() for p in planned]

    # The batches are packed: rows of row_tokens, document numbers, positions restarting.
    docs_per_row = []
    for mb in (mb for r in ranks for mb in r if mb.input_ids.numel()):
        x = api.batch_tensors(mb)
        assert is_packed(x["attention_mask"]) and x["input_ids"].shape[1] == ROW_TOKENS
        assert x["input_ids"].shape[0] <= ROWS_PER_STEP // WORLD
        starts = int(((x["position_ids"] == 0) & (x["attention_mask"] > 0)).sum())
        assert starts == mb.sample_ids.size == int(x["attention_mask"].amax(1).sum())
        docs_per_row.append(mb.sample_ids.size / x["input_ids"].shape[0])
    assert np.mean(docs_per_row) > 1.5  # several documents share a row

    # A loop of its own: the ranks' losses averaged as DDP would, one optimizer step per step.
    torch.manual_seed(0)
    model = build_model(cfg.model, ROW_TOKENS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in zip(*ranks, strict=True):
        loss = 0.0
        for mb in step:
            x = api.batch_tensors(mb)
            logits = model(x["input_ids"], x["attention_mask"], x["position_ids"])
            loss = loss + api.next_token_loss(logits, x["labels"]) / WORLD
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])
