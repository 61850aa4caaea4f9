"""pipeline.data.api, the delivery API for your own loop: every sample once per epoch across ranks,
one bucket per global step on every rank, resume from a step, empty shares joinable by DDP."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.core.config import validate
from pipeline.data import api

pytestmark = pytest.mark.ray


def test_driver_prepares_and_ranks_iterate_their_micro_batches(cluster, tmp_path):
    cfg = validate(
        {
            "data": {
                "synthetic": {"num_samples": 300, "shards": 2, "out_dir": str(tmp_path / "d")},
                "max_length": 64,
                "over_length": "truncate",
            },
            "buckets": {"num_buckets": 3},
            "batching": {"token_budget": 512},
            "model": {"vocab_size": 64},
            "train": {"epochs": 3, "max_steps": 50},  # cut in epoch 1 (plans of 40 steps)
        }
    )
    delivery = api.prepare_delivery(cfg, name="api-test-feeder")
    try:
        _the_first_range_is_prepared_before_any_request(delivery)
        assert api.Delivery.from_dict(delivery.to_dict()) == delivery
        S, world = delivery.steps_per_epoch, 2
        ranks = [
            list(api.iter_micro_batches(delivery, epoch=0, rank=r, world_size=world))
            for r in range(world)
        ]
        assert [len(r) for r in ranks] == [S, S]
        for a, b in zip(*ranks, strict=True):
            assert a.step == b.step and a.bucket == b.bucket
        ids = np.concatenate([mb.sample_ids for r in ranks for mb in r])
        assert ids.size == delivery.num_samples == np.unique(ids).size
        # Resuming at step k gives exactly the tail of the epoch.
        k = S // 2
        tail = list(api.iter_micro_batches(delivery, epoch=0, start_step=k, rank=1, world_size=2))
        assert [mb.sample_ids.tolist() for mb in tail] == [
            mb.sample_ids.tolist() for mb in ranks[1][k:]
        ]
        t = api.batch_tensors(ranks[0][0])
        assert set(t) == {"input_ids", "attention_mask", "position_ids", "labels"}
        assert t["input_ids"].dtype == torch.int64
        with pytest.raises(ValueError, match="start_step"):
            next(api.iter_micro_batches(delivery, epoch=0, start_step=S + 1, rank=0, world_size=2))
        _the_run_spans_epochs_and_resumes_at_a_global_step(cfg, delivery, ranks[0])
        _a_feeder_planned_differently_is_refused(cfg, delivery)
    finally:
        api.stop_delivery(delivery)


def _the_run_spans_epochs_and_resumes_at_a_global_step(cfg, delivery, epoch0):
    from pipeline.core.epochs import epoch_plan_for
    from pipeline.data import build_length_index

    index = build_length_index(cfg, delivery.path)
    planned = [epoch_plan_for(cfg, index, delivery.edges, e, 1).num_steps for e in range(2)]
    assert delivery.epoch_steps == planned and planned[0] < delivery.total_steps == 50 < sum(
        planned
    )
    run = list(api.iter_run(delivery, rank=0, world_size=2))
    where = [(mb.epoch, mb.step) for mb in run]
    assert where == [(0, s) for s in range(planned[0])] + [(1, s) for s in range(50 - planned[0])]
    assert [mb.sample_ids.tolist() for mb in run[: planned[0]]] == [
        mb.sample_ids.tolist() for mb in epoch0
    ]
    for k in (planned[0] - 1, planned[0] + 2):  # resume before and after the epoch boundary
        tail = list(api.iter_run(delivery, start_step=k, rank=0, world_size=2))
        assert [(mb.epoch, mb.step) for mb in tail] == where[k:]
    assert list(api.iter_run(delivery, start_step=50, rank=0, world_size=2)) == []


def _the_first_range_is_prepared_before_any_request(delivery):
    """prepare_delivery asked the feeder for the first range at the workers' world size
    (scaling.num_workers = 2) before any rank asked: it shows up without a request."""
    import time

    import ray

    feeder = ray.get_actor(delivery.feeder)
    deadline = time.monotonic() + 60
    while not (jobs := ray.get(feeder.status.remote())) and time.monotonic() < deadline:
        time.sleep(0.05)
    keys = [
        j["key"] if "key" in j else (j["epoch"], j["world_size"], j["start_step"]) for j in jobs
    ]
    assert [tuple(k[:3]) for k in keys] == [(0, 2, 0)] and delivery.world_size == 2


def _a_feeder_planned_differently_is_refused(cfg, delivery):
    """A feeder under the delivery's name serving another plan (another seed): every rank
    refuses its answer instead of training on it (contract 6)."""
    from pipeline.data import PlanMismatchError, build_length_index, start_feeder

    other = cfg.model_copy(update={"plan": cfg.plan.model_copy(update={"seed": cfg.plan.seed + 1})})
    index = build_length_index(other, delivery.path)
    start_feeder(other, index, delivery.edges, name=delivery.feeder, path=delivery.path)
    with pytest.raises(PlanMismatchError, match="epoch 0: the feeder's plan has hash"):
        next(api.iter_micro_batches(delivery, epoch=0, rank=0, world_size=2))
    with pytest.raises(PlanMismatchError):
        next(api.iter_run(delivery, start_step=delivery.epoch_steps[0], rank=1, world_size=2))


def test_an_empty_share_becomes_a_batch_without_supervised_tokens():
    empty = torch.zeros(0, 0, dtype=torch.int64)
    mb = api.MicroBatch(0, 0, 0, np.zeros(0, np.int64), empty, empty, empty, empty, 0, 0)
    t = api.batch_tensors(mb)
    assert t["input_ids"].shape == (1, 2) and bool((t["labels"] == -100).all())


def test_next_token_loss_is_the_supervised_tokens_mean_and_zero_without_any():
    logits = torch.randn(2, 4, 5, requires_grad=True)
    labels = torch.tensor([[7, 1, 2, -100], [7, 3, -100, -100]])
    want = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 5)[[0, 1, 3]], torch.tensor([1, 2, 3])
    )
    torch.testing.assert_close(api.next_token_loss(logits, labels), want)
    none = api.next_token_loss(logits, torch.full((2, 4), -100))
    none.backward()
    assert none.item() == 0.0 and logits.grad is not None
