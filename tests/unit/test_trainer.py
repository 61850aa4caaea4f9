"""The Trainer on one process without Ray (and on 2 gloo processes): exact resume, each step
logged once across restarts, per-bucket curves from their own steps, non-finite loss stops the
run without a checkpoint, a stop request checkpoints at the same step on every rank."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.learn.logger import ListLogger, make_logger, run_id_for
from pipeline.learn.loss import NonFiniteLossError
from pipeline.train.faults import FAIL_AT_STEP_ENV, FAIL_MARKER_ENV
from pipeline.train.progress import SampleRecorder, step_metrics
from pipeline.train.step import GroupStats
from tests.unit.trainer_fixtures import STEPS, Saver, batches_for, config, trainer


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_contract7_resume_after_a_failure_trains_the_same_batches_and_weights(tmp_path):
    ref_saver = Saver(tmp_path / "ref")
    ref = trainer(tmp_path / "ref", config(tmp_path / "ref"), ref_saver)
    assert ref.fit(batches_for(), ListLogger()) == "done"

    d = tmp_path / "run"
    cfg = config(d, record_sample_ids=str(d / "ids"))
    saver = Saver(d)
    os.environ[FAIL_AT_STEP_ENV], os.environ[FAIL_MARKER_ENV] = "4", str(d / "failed")
    try:
        t = trainer(d, cfg, saver, recorder=SampleRecorder(str(d / "ids"), 0))
        with pytest.raises(RuntimeError, match="injected failure after global step 4"):
            t.fit(batches_for(), ListLogger())
        t = trainer(d, cfg, saver, recorder=SampleRecorder(str(d / "ids"), 0))
        assert t.steps_done == 3  # the step-3 checkpoint
        assert t.fit(batches_for(), ListLogger()) == "done"
    finally:
        del os.environ[FAIL_AT_STEP_ENV], os.environ[FAIL_MARKER_ENV]

    recs = _jsonl(d / "ids" / "rank0.jsonl")
    assert [(r["epoch"], r["step"]) for r in recs if r.get("event")] == [(0, 0), (0, 3)]
    trained = [(r["epoch"], r["step"]) for r in recs if "ids" in r]
    assert trained == [(0, s) for s in range(4)] + [(0, s) for s in range(3, 6)] + [
        (1, s) for s in range(6)
    ]
    a, b = ref_saver.latest(), saver.latest()
    assert b.position == a.position and b.counters == a.counters
    assert b.tracker == a.tracker  # the debiased loss resumes exactly too
    for k in a.model:
        torch.testing.assert_close(b.model[k], a.model[k], rtol=1e-5, atol=1e-6)
    assert [n for n, _ in saver.reports] == [n for n, _ in ref_saver.reports]
    # The run's picture is drawn from the same history: the steps trained again after the
    # failure replace the lost ones, one row per global step.
    h, h_ref = saver.latest_history().arrays(), ref_saver.latest_history().arrays()
    assert h["step"].tolist() == h_ref["step"].tolist() == list(range(1, 2 * STEPS + 1))
    assert h["epoch"].tolist() == h_ref["epoch"].tolist()
    assert h["bucket"].tolist() == h_ref["bucket"].tolist()
    np.testing.assert_allclose(h["loss"], h_ref["loss"], rtol=1e-4)
    np.testing.assert_allclose(h["lr"], h_ref["lr"])
    np.testing.assert_array_equal(h["real"], h_ref["real"])


def test_contract7_resume_at_an_epoch_end_when_epochs_plan_different_step_counts(tmp_path):
    # Greedy fill plans each epoch's own number of steps: a checkpoint at the end of a 5-step
    # epoch 0 must resume at epoch 1 step 0 and train all 7 steps of epoch 1.
    planned = (5, 7)
    ref_saver = Saver(tmp_path / "ref")
    ref = trainer(tmp_path / "ref", config(tmp_path / "ref"), ref_saver, planned=planned)
    assert ref.total_steps == 12
    assert ref.fit(batches_for(planned=planned), ListLogger()) == "done"

    d = tmp_path / "run"
    cfg = config(d, record_sample_ids=str(d / "ids"))
    saver = Saver(d)
    os.environ[FAIL_AT_STEP_ENV], os.environ[FAIL_MARKER_ENV] = "5", str(d / "failed")
    try:
        t = trainer(d, cfg, saver, recorder=SampleRecorder(str(d / "ids"), 0), planned=planned)
        with pytest.raises(RuntimeError, match="injected failure after global step 5"):
            t.fit(batches_for(planned=planned), ListLogger())
        t = trainer(d, cfg, saver, recorder=SampleRecorder(str(d / "ids"), 0), planned=planned)
        assert (t.position.epoch, t.position.next_step, t.steps_done) == (1, 0, 5)
        assert t.fit(batches_for(planned=planned), ListLogger()) == "done"
    finally:
        del os.environ[FAIL_AT_STEP_ENV], os.environ[FAIL_MARKER_ENV]

    recs = _jsonl(d / "ids" / "rank0.jsonl")
    trained = [(r["epoch"], r["step"]) for r in recs if "ids" in r]
    assert trained == [(0, s) for s in range(5)] + [(1, s) for s in range(7)]
    a, b = ref_saver.latest(), saver.latest()
    assert (b.position.epoch, b.position.next_step, b.position.steps_done) == (1, 7, 12)
    assert b.position == a.position and b.counters == a.counters
    for k in a.model:
        torch.testing.assert_close(b.model[k], a.model[k], rtol=1e-5, atol=1e-6)


def test_restarted_run_logs_each_step_once_into_one_wandb_id(tmp_path, monkeypatch):
    """A crash at step 4 after the step-3 checkpoint: steps 4 is trained again after the
    restart but logged once, and both attempts use the id derived from the run directory."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = config(tmp_path, metrics_file=str(tmp_path / "m.jsonl"))
    saver = Saver(tmp_path / "ckpt")
    monkeypatch.setenv(FAIL_AT_STEP_ENV, "4")
    monkeypatch.setenv(FAIL_MARKER_ENV, str(tmp_path / "failed"))
    ids = []
    for _ in range(2):
        t = trainer(tmp_path, cfg, saver)
        ids.append(t.run_id)
        logger = make_logger(
            cfg,
            rank=0,
            run_id=t.run_id,
            wandb_dir=cfg.wandb.dir,
            metrics_file=cfg.train.metrics_file,
        )
        try:
            t.fit(batches_for(), logger)
        except RuntimeError:
            pass
    assert ids == [run_id_for(str(tmp_path / "runs" / "run"))] * 2
    steps = [m["step"] for m in _jsonl(tmp_path / "m.jsonl") if "train/loss" in m]
    assert steps == list(range(1, 2 * STEPS + 1))


def test_per_bucket_loss_is_logged_only_at_that_buckets_steps_with_their_loss(tmp_path):
    log = ListLogger()
    trainer(tmp_path, config(tmp_path), Saver(tmp_path)).fit(batches_for(), log)
    step_logs = [m for _, m in log.records if "train/loss" in m]
    assert len(step_logs) == 2 * STEPS
    for m in step_logs:
        by_bucket = {k: v for k, v in m.items() if k.startswith("train/loss_by_bucket/")}
        assert by_bucket == {f"train/loss_by_bucket/{m['train/bucket']}": m["train/loss"]}


def test_per_bucket_loss_of_an_accumulated_group_is_each_buckets_token_mean():
    stats = GroupStats(
        steps=[0, 1, 2],
        buckets=[1, 0, 1],
        loss_sum=np.array([10.0, 3.0, 2.0]),
        correct=np.zeros(3),
        tokens=np.array([5.0, 3.0, 3.0]),
        real=np.ones(3),
        padded=np.ones(3),
        samples=np.ones(3),
    )
    m = step_metrics(stats, lr=1.0, grad_norm=1.0, debiased=0.0, epoch=0)
    assert {k: v for k, v in m.items() if "by_bucket" in k} == {
        "train/loss_by_bucket/0": 1.0,
        "train/loss_by_bucket/1": 12.0 / 8.0,
    }


def test_nonfinite_loss_stops_naming_step_bucket_and_ids_without_checkpoint(tmp_path):
    """An infinite learning rate (the config refuses one; set on the optimizer here, as a diverging
    run would reach it): the first update makes the weights NaN, the next loss is NaN: the run
    stops there, names it, and no checkpoint is ever written."""
    saver = Saver(tmp_path)
    t = trainer(tmp_path, config(tmp_path, warmup_steps=0), saver)
    t.scheduler.base_lrs = [float("inf")] * len(t.scheduler.base_lrs)
    for group in t.optimizer.param_groups:
        group["lr"] = float("inf")
    with pytest.raises(
        NonFiniteLossError,
        match=r"epoch 0 step 1 \(bucket 1; rank 0's sample ids \[100, 101, 102\]\)",
    ):
        t.fit(batches_for(), ListLogger())
    assert t.steps_done == 1 and saver.reports == []


def test_nonfinite_steps_are_skipped_up_to_the_limit_and_never_checkpointed(tmp_path):
    """max_nonfinite_steps=2: two NaN steps are skipped (no update, no checkpoint at step 3),
    the third stops the run."""
    saver = Saver(tmp_path)
    t = trainer(tmp_path, config(tmp_path, max_nonfinite_steps=2), saver)
    step = t.step

    def poisoned(group, *args, **kw):  # at the step: the stream runs ahead of it
        if group[0].step >= 1:
            for mb in group:
                mb.input_ids[:] = 0
            t.model.tok.weight.data[0] = float("nan")  # token 0 -> NaN logits
        return step(group, *args, **kw)

    t.step = poisoned
    with pytest.raises(NonFiniteLossError, match="3 non-finite step"):
        t.fit(batches_for(), ListLogger())
    assert t.steps_done == 3 and t.counters["updates"] == 1 and saver.reports == []


def _stop_worker(rank: int, world: int, store: str, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    calls = iter(range(100))
    saver = Saver(Path(tmp) / "ckpt")
    # Only rank 1 is asked, at its third step.
    stop = (lambda: next(calls) == 2) if rank == 1 else (lambda: False)
    t = trainer(Path(tmp), config(Path(tmp)), saver, rank=rank, world=world, stop=stop)
    status = t.fit(batches_for(rank), ListLogger())
    (Path(tmp) / f"rank{rank}.json").write_text(
        json.dumps({"status": status, "steps": t.steps_done, "reports": saver.reports})
    )
    dist.destroy_process_group()
    os._exit(0)  # gloo's threads can abort the interpreter's exit (SIGABRT) after the work


def test_stop_request_on_one_rank_checkpoints_every_rank_at_the_same_step():
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_stop_worker, args=(2, os.path.join(d, "store"), d), nprocs=2, join=True)
        out = [json.loads((Path(d) / f"rank{r}.json").read_text()) for r in (0, 1)]
        for r in out:
            assert r["status"] == "stopped" and r["steps"] == 3
            name, metrics = r["reports"][-1]
            assert name == "checkpoint_step00000003" and metrics["stopped"] == 1
        # The stop checkpoint resumes at the next step.
        state = Saver(Path(d) / "ckpt").latest()
        assert (state.position.epoch, state.position.next_step) == (0, 3)


def _unused_worker(rank: int, world: int, store: str, tmp: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    out = {}
    for flag in (False, True):
        cfg = config(Path(tmp) / str(flag), find_unused_parameters=flag)
        cfg.model.name = "tests.unit.trainer_fixtures:model_with_an_unused_layer"
        t = trainer(
            Path(tmp) / str(flag), cfg, Saver(Path(tmp) / f"ckpt-{flag}"), rank=rank, world=world
        )
        try:
            out[str(flag)] = [t.fit(batches_for(rank), ListLogger()), t.steps_done]
        except RuntimeError as e:
            out[str(flag)] = [type(e).__name__, str(e), getattr(e, "retryable", True)]
    (Path(tmp) / f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()
    os._exit(0)  # gloo's threads can abort the interpreter's exit (SIGABRT) after the work


def test_a_model_with_unused_parameters_stops_naming_the_field_or_trains_with_it():
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_unused_worker, args=(2, os.path.join(d, "store"), d), nprocs=2, join=True)
        for r in (0, 1):
            out = json.loads((Path(d) / f"rank{r}.json").read_text())
            name, msg, retryable = out["False"]
            assert name == "UnusedParametersError" and retryable is False
            assert "set train.find_unused_parameters=true" in msg and "\n" not in msg
            assert out["True"] == ["done", 2 * STEPS]
