"""One driver setup for `jobs.train` and the own-loop API (`pipeline.data.driver`): the own-loop
driver plans at the world size its workers will have, records each epoch's plan hash for the
ranks to check the feeder against, and starts the first range before any rank asks. Ray-free:
the feeder is a fake that records what the driver asks of it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import pipeline.data.driver as driver
from pipeline.core.config import ConfigError
from pipeline.core.epochs import run_epoch_plans
from pipeline.data import LengthIndex, api
from tests.helpers import tiny_config


class _Remote:
    def __init__(self, calls: list, name: str):
        self.calls, self.name = calls, name

    def remote(self, *args):
        self.calls.append((self.name, *args))


class _FakeFeeder:
    """What `start_feeder` returns: an actor handle whose calls are recorded, never run."""

    def __init__(self, calls: list):
        self.start_at = _Remote(calls, "start_at")
        self.part = _Remote(calls, "part")


def _index(cfg, path) -> LengthIndex:
    """600 samples of 8..64 tokens, as a scan of the tiny corpus would index them."""
    lengths = np.random.default_rng(0).integers(8, 65, 600).astype(np.int32)
    return LengthIndex(np.arange(600, dtype=np.int64), lengths, [], "fake", 0, path=path)


@pytest.fixture
def feeder_calls(monkeypatch) -> list:
    """Ray stays down: connecting is a no-op, the index is made up (a scan would use Ray Data)
    and the feeder is a recorder."""
    calls: list = []
    monkeypatch.setattr(driver, "resolve_data_path", lambda cfg: "data")
    monkeypatch.setattr(driver, "build_length_index", _index)

    def start_feeder(cfg, index, edges, *, name, path, **kw):
        calls.append(("start_feeder", name))
        return _FakeFeeder(calls)

    monkeypatch.setattr(api, "connect", lambda *a, **kw: None)
    monkeypatch.setattr(driver, "start_feeder", start_feeder)
    return calls


def test_the_own_loop_driver_starts_the_first_range_before_any_request(tmp_path, feeder_calls):
    cfg = tiny_config(tmp_path, scaling={"num_workers": 3})
    delivery = api.prepare_delivery(cfg, name="f")
    # the feeder was started, then asked for the range a stream from (epoch 0, step 0) at the
    # workers' world size will request first -- and nothing was requested yet
    assert feeder_calls == [("start_feeder", "f"), ("start_at", 0, 3, 0)]
    assert delivery.world_size == 3


def test_a_resumed_own_loop_run_starts_the_range_of_its_next_step(tmp_path, feeder_calls):
    cfg = tiny_config(tmp_path, train={"epochs": 2})
    first = api.prepare_delivery(cfg, name="f")
    feeder_calls.clear()
    k = first.epoch_steps[0] + 3  # three steps into epoch 1
    api.prepare_delivery(cfg, name="f", world_size=4, start_step=k)
    assert feeder_calls == [("start_feeder", "f"), ("start_at", 1, 4, 3)]
    feeder_calls.clear()
    api.prepare_delivery(cfg, name="f", start_step=first.total_steps)  # nothing left to train
    assert feeder_calls == [("start_feeder", "f")]


def test_an_elastic_world_size_starts_nothing_ahead(tmp_path, feeder_calls):
    cfg = tiny_config(tmp_path, scaling={"num_workers": 2, "min_workers": 1})
    api.prepare_delivery(cfg, name="f")  # the world size is only known in the workers
    assert feeder_calls == [("start_feeder", "f")]


def test_the_own_loop_driver_plans_at_the_world_size_it_is_given(tmp_path, feeder_calls):
    packed = {"mode": "packed", "row_tokens": 64, "rows_per_step": 3}
    cfg = tiny_config(tmp_path, batching=packed, scaling={"num_workers": 3})
    assert api.prepare_delivery(cfg, name="f").world_size == 3
    # three rows per step cannot be shared by two ranks: refused on the driver, before the
    # feeder starts, not by the feeder at the first rank's request
    feeder_calls.clear()
    with pytest.raises(ConfigError, match="rows_per_step=3 is not divisible by the world size 2"):
        api.prepare_delivery(cfg, name="f", world_size=2)
    assert feeder_calls == []


def test_the_delivery_carries_each_epochs_plan_hash(tmp_path, feeder_calls):
    cfg = tiny_config(tmp_path, train={"epochs": 2})
    d = api.prepare_delivery(cfg, name="f")
    index = driver.find_run_data(cfg).index
    plans = list(run_epoch_plans(cfg, index, d.edges, 1))  # the hash is world-size independent
    assert d.plan_hashes == [p.content_hash for p in plans] and len(set(d.plan_hashes)) == 2
    assert api.Delivery.from_dict(d.to_dict()) == d


def test_contract6_a_rank_holds_the_feeder_to_the_plan_hash_the_driver_recorded(monkeypatch):
    asked = []

    def rank_batches(feeder, **kw):
        asked.append(kw["plan_hash"])
        return iter(())

    monkeypatch.setattr(api, "rank_batches", rank_batches)
    d = api.Delivery("f", "p", [0, 8], 4, 10, [4, 4], 8, ["h0", "h1"], 2)
    for e in (0, 1, 2):  # epoch 2 is past the run: no hash to hold the feeder to
        list(api.iter_micro_batches(d, epoch=e, rank=0, world_size=2))
    assert asked == ["h0", "h1", None]


def test_run_position_places_a_global_step_in_its_epoch():
    plan = driver.RunPlan(2, ["a", "b"], [4, 5], 7, [{}, {}])  # max_steps cut epoch 1 at 3
    where = [driver.run_position(plan, k) for k in range(8)]
    assert where == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), None]


def test_launch_and_the_own_loop_plan_the_same_run(tmp_path, feeder_calls):
    """The two drivers share their setup: same edges, steps, hashes and world size."""
    from pipeline.train import launch

    cfg = tiny_config(tmp_path, train={"epochs": 2})
    d = api.prepare_delivery(cfg)
    plan, epochs = launch._plan_epochs(cfg, driver.find_run_data(cfg))
    assert (plan.steps, plan.total_steps, plan.world_size) == (
        d.epoch_steps,
        d.total_steps,
        d.world_size,
    )
    assert [e["hash"] for e in epochs] == d.plan_hashes == plan.hashes
    assert epochs[0]["metrics"]["epoch/plan_hash"] == d.plan_hashes[0]
    assert dataclasses.asdict(plan)["described"] == [e["metrics"] for e in epochs]


def test_jobs_train_and_the_own_loop_give_an_empty_share_the_same_placeholder():
    """An empty micro-batch reaches the model as one placeholder batch on both paths."""
    import torch

    from pipeline.train.step import train_group

    empty = torch.zeros(0, 0, dtype=torch.int64)
    mb = api.MicroBatch(0, 0, 0, np.zeros(0, np.int64), empty, empty, empty, empty, 0, 0)
    seen = []

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(4, 4)

        def forward(self, ids, mask, pos):
            seen.append({"input_ids": ids, "attention_mask": mask, "position_ids": pos})
            return self.emb(ids)

    stats = train_group(Model(), [mb], device=torch.device("cpu"), world_size=1)
    want = api.batch_tensors(mb)
    assert want["input_ids"].shape == (1, 2) and bool((want["labels"] == -100).all())
    assert seen[0].keys() == want.keys() - {"labels"}
    for k, v in seen[0].items():
        assert torch.equal(v, want[k]), k
    assert stats.tokens.tolist() == [0] and stats.samples.tolist() == [0]


@pytest.mark.parametrize("policy", ["sorted", "random", "bucketed"])
def test_planned_padding_counts_what_collate_pads_under_every_policy(policy):
    """epoch/planned_padding_efficiency caps each micro-batch at its bucket's edge in the plan's
    own edges: a sorted or random plan is one bucket, whatever edges the config names (capping
    at the config's first edge once overstated it)."""
    from pipeline.core.collate import padded_length
    from pipeline.core.config import validate
    from pipeline.core.epochs import epoch_plan_for, resolve_edges
    from pipeline.train.launch import epoch_metrics

    raw = {
        "data": {"synthetic": {"num_samples": 3000}, "max_length": 128},
        "buckets": {"edges": [0, 32, 64, 128]},
        "model": {"d_model": 32, "n_heads": 2},
    }
    if policy != "bucketed":
        raw["plan"] = {"policy": policy}
    cfg = validate(raw)
    lengths = np.random.default_rng(0).integers(1, 129, 3000)
    index = SimpleNamespace(sample_ids=np.arange(3000), lengths=lengths)
    plan = epoch_plan_for(cfg, index, resolve_edges(cfg, lengths), 0, 2)
    lens, offsets = plan.micro_batch_lengths()
    buckets = plan.micro_batch_buckets()
    real = paid = 0
    for i, b in enumerate(buckets):  # what collate pads each micro-batch to, one at a time
        mb = lens[offsets[i] : offsets[i + 1]]
        if mb.size:
            real += int(mb.sum())
            paid += mb.size * padded_length(int(mb.max()), int(plan.edges[b + 1]), 8)
    got = epoch_metrics(plan)["epoch/planned_padding_efficiency"]
    assert got == pytest.approx(real / paid)
