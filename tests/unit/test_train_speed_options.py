"""What makes a step fast without changing what it computes: AdamW fused on CUDA and foreach
elsewhere (kept through a resume), train.compile (checkpoints keep the plain model's keys), and
expandable segments for the CUDA allocator under padded batches (never over a user's setting)."""

from __future__ import annotations

import os

import pytest
import torch

from pipeline.core.config import TrainConfig
from pipeline.learn.logger import ListLogger
from pipeline.learn.optim import (
    adamw_implementation,
    build_optimizer,
    build_scheduler,
    compiled,
    load_with_current_settings,
)
from pipeline.train.loop import EXPANDABLE_SEGMENTS, allocator_setting, use_allocator_setting
from tests.unit.trainer_fixtures import Saver, batches_for, config, trainer


def test_adamw_is_fused_on_cuda_and_foreach_elsewhere():
    assert adamw_implementation("cuda") == {"fused": True}
    assert adamw_implementation("cpu") == {"foreach": True}
    g = build_optimizer(torch.nn.Linear(4, 4), TrainConfig()).param_groups[0]
    assert g["foreach"] is True and not g["fused"]


def _stepped(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    for g in opt.param_groups:
        for p in g["params"]:
            p.grad = torch.ones_like(p)
    opt.step()
    return opt


def test_a_resume_keeps_this_devices_adamw_implementation():
    """A checkpoint from another device (or before the implementation was chosen) holds its
    own fused/foreach flags in its groups: the current device's stay, and fused keeps its step
    counts as fp32 tensors on the parameters' device."""
    cfg = TrainConfig()
    model = torch.nn.Linear(4, 4)
    old = torch.optim.AdamW(
        [{"params": [model.weight]}, {"params": [model.bias]}], foreach=None, fused=None
    )
    state = _stepped(old).state_dict()
    settings = {"lr": cfg.lr}
    for want in ({"foreach": True}, {"fused": True}):
        opt = torch.optim.AdamW(
            [{"params": [model.weight]}, {"params": [model.bias]}], lr=cfg.lr, **want
        )
        sched = build_scheduler(opt, cfg, total_steps=10)
        load_with_current_settings(opt, sched, state, sched.state_dict(), None, settings)
        for g in opt.param_groups:
            assert {k: g[k] for k in want} == want
        if "fused" in want:
            steps = [s["step"] for s in opt.state.values()]
            assert all(t.dtype == torch.float32 for t in steps)
        _stepped(opt)  # and it steps with what it loaded


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile traced by TorchDynamo but run eagerly: the wiring without code generation
    (seconds on a CPU instead of minutes); the slow test below compiles for real."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real(m, backend="eager", **kw))


def test_compiled_training_checkpoints_the_plain_models_keys(tmp_path, eager_compile):
    _compiled_run_checkpoints_plain_keys(tmp_path)


@pytest.mark.slow
def test_compiled_training_with_inductor_checkpoints_the_plain_models_keys(tmp_path):
    _compiled_run_checkpoints_plain_keys(tmp_path)


def _compiled_run_checkpoints_plain_keys(tmp_path):
    """train.compile: the step runs the compiled forward, a checkpoint saves the model itself
    (no `_orig_mod.` prefix), and it loads into an uncompiled model."""
    torch._dynamo.reset()
    cfg = config(tmp_path, compile=True, epochs=1, max_steps=3)
    saver = Saver(tmp_path / "ckpt")
    t = trainer(tmp_path, cfg, saver)
    assert t.fit(batches_for(), ListLogger()) == "done"
    assert isinstance(t.ddp, torch._dynamo.eval_frame.OptimizedModule)
    assert t.ddp._orig_mod is t.model
    keys = list(saver.latest().model)
    assert keys == list(t.model.state_dict())
    assert not [k for k in keys if "_orig_mod" in k]
    plain = trainer(tmp_path / "plain", config(tmp_path / "plain"), Saver(tmp_path / "p"))
    plain.model.load_state_dict(saver.latest().model)  # strict: the same names


def test_a_ddp_model_is_compiled_in_place_and_stays_ddp(tmp_path, eager_compile):
    """Under DDP the wrapper itself is compiled (the step's `no_sync` needs a DDP)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        model = torch.nn.Linear(4, 4)
        ddp = DistributedDataParallel(model)
        out = compiled(ddp)
        assert out is ddp and isinstance(out, DistributedDataParallel)
        assert out._compiled_call_impl is not None
        assert list(out.module.state_dict()) == ["weight", "bias"]
        out(torch.ones(2, 4)).sum().backward()  # through DDP's hooks
        assert model.weight.grad is not None and torch.equal(model.bias.grad, torch.full((4,), 2.0))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "environ, packed, want",
    [
        ({}, False, EXPANDABLE_SEGMENTS),
        ({}, True, None),  # packed rows: one shape every step
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}, False, None),
        ({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}, False, None),
        ({"PYTORCH_CUDA_ALLOC_CONF": ""}, False, None),  # set, even empty: the user's
    ],
)
def test_expandable_segments_for_padded_batches_never_over_the_users_setting(environ, packed, want):
    assert allocator_setting(environ, packed=packed) == want


def test_a_cuda_worker_applies_the_allocator_setting_to_the_running_allocator(monkeypatch):
    applied = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", applied.append)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    padded = config_for("token_budget")
    use_allocator_setting(padded, torch.device("cpu"))
    assert applied == [] and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    use_allocator_setting(padded, torch.device("cuda", 0))
    assert applied == [EXPANDABLE_SEGMENTS]
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == EXPANDABLE_SEGMENTS
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.8")
    use_allocator_setting(padded, torch.device("cuda", 0))
    assert applied == [EXPANDABLE_SEGMENTS]  # the user's value stays, nothing applied
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.8"
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    use_allocator_setting(config_for("packed"), torch.device("cuda", 0))
    assert applied == [EXPANDABLE_SEGMENTS]  # packed rows: left as it is


def config_for(mode: str):
    from tests.helpers import tiny_config

    if mode == "packed":
        return tiny_config(batching={"mode": "packed", "rows_per_step": 2, "row_tokens": 64})
    return tiny_config(batching={"mode": mode})
