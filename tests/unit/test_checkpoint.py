"""Checkpoints: round trip, incomplete or foreign ones refused, resume checks (contracts 7, 8)."""

import json
import random

import numpy as np
import pytest
import torch

from pipeline.core.metrics import BucketLossTracker
from pipeline.learn.checkpoint import (
    CheckpointError,
    DataPosition,
    ResumeError,
    TrainState,
    check_resume,
    global_batch_definition,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from pipeline.learn.loss import NonFiniteLossError
from tests.helpers import tiny_config

EDGES = [0, 64, 128]


def _state(world: int = 2) -> TrainState:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    gb = global_batch_definition(tiny_config(), EDGES)
    return TrainState(
        model=model.state_dict(),
        optimizer=opt.state_dict(),
        scheduler=sched.state_dict(),
        position=DataPosition(1, 7, "abc", world, gb, 27),
        wandb_run_id="run123",
        counters={"updates": 27, "tokens": 1e6},
        tracker=_tracker_state(),
        rng=rng_state(),
    )


def _tracker_state() -> dict:
    t = BucketLossTracker(3)
    for k, loss in enumerate([4.0, 3.1, 3.5, 2.9, 3.2, 2.7, 3.0, 2.6]):
        t.update(k % 3, loss)
    return t.state_dict()


def test_round_trip_restores_everything(tmp_path):
    st = _state()
    save_checkpoint(tmp_path, st, rank=0)
    save_checkpoint(tmp_path, _state(), rank=1)
    back = load_checkpoint(tmp_path, rank=0)
    for k, v in st.model.items():
        torch.testing.assert_close(back.model[k], v)
    assert back.optimizer["state"][0]["step"] == st.optimizer["state"][0]["step"]
    assert back.position == st.position and back.wandb_run_id == "run123"
    assert back.counters == st.counters and back.scheduler["base_lrs"] == st.scheduler["base_lrs"]
    assert back.tracker == st.tracker and st.tracker["losses"]  # loadable with weights_only
    assert json.loads((tmp_path / "state.json").read_text())["position"]["version"] == 1
    assert load_checkpoint(tmp_path, rank=1).rng is not None
    assert load_checkpoint(tmp_path, rank=2).rng is None  # a grown world: reseeded, not an error


def test_rng_state_replays_the_same_numbers():
    st = rng_state()
    a = (torch.rand(3), random.random(), np.random.rand())
    set_rng_state(st)
    b = (torch.rand(3), random.random(), np.random.rand())
    torch.testing.assert_close(a[0], b[0])
    assert a[1:] == b[1:]


def test_incomplete_checkpoint_is_refused(tmp_path):
    save_checkpoint(tmp_path, _state(), rank=1)  # rank 0 never finished: no state.json
    with pytest.raises(CheckpointError, match="incomplete checkpoint.*state.json"):
        load_checkpoint(tmp_path)


def test_other_version_is_refused(tmp_path):
    save_checkpoint(tmp_path, _state(), rank=0)
    meta = json.loads((tmp_path / "state.json").read_text())
    meta["version"] = 99
    (tmp_path / "state.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="version 99"):
        load_checkpoint(tmp_path)


def test_position_after_last_step_rolls_over_to_next_epoch():
    p = DataPosition(0, 10, "h", 2, {}, 10)
    assert p.normalized(10) == DataPosition(1, 0, "h", 2, {}, 10)
    assert DataPosition(0, 9, "h", 2, {}, 9).normalized(10).next_step == 9


def _check(pos, cfg=None, plan_hash="abc", world=2, policy="keep_order"):
    gb = global_batch_definition(cfg or tiny_config(), EDGES)
    check_resume(
        pos, global_batch=gb, plan_hash=plan_hash, world_size=world, on_world_size_change=policy
    )


def test_contract8_resume_with_another_world_size_keeps_order_or_refuses():
    pos = _state(world=2).position
    _check(pos, world=2)
    _check(pos, world=4)  # keep_order: global batches do not depend on the world size
    with pytest.raises(ResumeError, match="written by 2 workers.*has 4.*on_world_size_change"):
        _check(pos, world=4, policy="refuse")


def test_contract7_resume_refuses_changed_batches_or_data():
    pos = _state().position
    other = tiny_config(batching={"token_budget": 2048})
    with pytest.raises(ResumeError, match="batching.token_budget: 1024 -> 2048"):
        _check(pos, cfg=other)
    with pytest.raises(ResumeError, match="plan hash.*data .* changed"):
        _check(pos, plan_hash="other")


def test_rng_state_touches_only_the_current_cuda_device(monkeypatch):
    """get_rng_state_all() would initialise every visible GPU from every rank; a rank saves and
    restores its own device's state only."""
    calls = []

    def forbidden(*a):
        raise AssertionError("every device's RNG touched")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", forbidden)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", forbidden)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: torch.tensor([7], dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s: calls.append(s.tolist()))
    state = rng_state()
    assert [s.tolist() for s in state["cuda"]] == [[7]]
    set_rng_state(state)
    # An older checkpoint with every device's state: the current device's (index 1) is restored.
    set_rng_state({**state, "cuda": [torch.tensor([1]), torch.tensor([2])]})
    assert calls == [[7], [2]]


def test_nonfinite_weights_are_never_written(tmp_path):
    state = _state()
    state.model["w"] = torch.tensor([1.0, float("nan")])
    with pytest.raises(NonFiniteLossError, match="refusing to write a checkpoint.*w"):
        save_checkpoint(tmp_path / "c", state, rank=0)
    assert not (tmp_path / "c").exists()
