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
        }
    )
    delivery = api.prepare_delivery(cfg, name="api-test-feeder")
    try:
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
    finally:
        api.stop_delivery(delivery)


def test_an_empty_share_becomes_a_batch_without_supervised_tokens():
    empty = torch.zeros(0, 0, dtype=torch.int64)
    mb = api.MicroBatch(0, 0, 0, np.zeros(0, np.int64), empty, empty, empty, empty, 0, 0)
    t = api.batch_tensors(mb)
    assert t["input_ids"].shape == (1, 2) and bool((t["labels"] == -100).all())
