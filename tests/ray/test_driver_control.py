"""The driver's side of a run, on a local Ray instance but without training: which cluster it
joins, what it refuses before any worker starts (resources, a resume that cannot continue, a
run directory in use) with one line and exit code 2, which worker failures it lets Ray Train
retry, and the graceful-stop signal handler."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray

from jobs.train import main
from pipeline.core.config import ConfigError, load_config
from pipeline.data import connect as connect_mod
from pipeline.learn.checkpoint import (
    STATE_FILE,
    DataPosition,
    ResumeError,
    global_batch_definition,
)
from pipeline.train import launch
from pipeline.train.runlock import RunLease

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_ray_init(monkeypatch):
    """ray.init recorded instead of run; Ray reported not initialised."""
    calls: list = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **kw: calls.append(kw.get("address")))
    return calls


# --------------------------------------------------------------------------- which cluster


def test_stale_ray_state_is_ignored_without_an_address(tmp_path, monkeypatch, no_ray_init):
    """A machine whose `ray start` cluster died: ray.init(address=None) would join the dead
    address in its state file; the driver starts a private instance instead."""
    from ray._private.services import get_ray_address_from_environment

    dead = f"127.0.0.1:{_dead_port()}"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(dead)
    assert get_ray_address_from_environment(None, None) == dead  # what address=None would join
    launch.init_ray(None)
    assert no_ray_init == ["local"]
    with pytest.raises(ConfigError, match=dead):  # given explicitly, it fails in one line
        launch.init_ray(dead, timeout_s=5)
    assert no_ray_init == ["local"]


def test_ray_address_from_job_submit_is_joined(monkeypatch, no_ray_init):
    monkeypatch.setattr(connect_mod, "check_reachable", lambda addr, timeout_s: None)
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    launch.init_ray(None)
    assert no_ray_init == ["10.1.2.3:6379"]


@pytest.fixture
def stale_address_file(monkeypatch):
    """A `ray start` head that died and left its address file; yields the dead address. The Ray
    temp dir is short (Ray's socket paths must fit in 107 bytes) and removed afterwards."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    dead = f"127.0.0.1:{_dead_port()}"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp))
    (tmp / "ray").mkdir()
    (tmp / "ray" / "ray_current_cluster").write_text(dead)
    yield dead
    shutil.rmtree(tmp, ignore_errors=True)


def test_plan_buckets_on_data_ignores_a_dead_address_file(tmp_path, stale_address_file):
    """The length index's scan starts Ray by the same rule as jobs.train: a private instance,
    not the dead cluster an address file names (which Ray Data's own ray.init would retry for
    minutes)."""
    import subprocess
    import sys

    from pipeline.data.corpus import write_corpus

    write_corpus(tmp_path / "d", num_samples=50, shards=1, vocab_size=64, progress=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.plan_buckets",
            "--data",
            str(tmp_path / "d"),
            "--json",
            str(tmp_path / "r.json"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]


def test_tokenize_with_a_dead_ray_address_fails_in_one_line(tmp_path, monkeypatch, capsys):
    from jobs import tokenize as tokenize_cli

    dead = f"127.0.0.1:{_dead_port()}"
    monkeypatch.setenv("RAY_ADDRESS", dead)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        tokenize_cli.main(
            ["--input", str(tmp_path), "--tokenizer", "x", "--out", str(tmp_path / "o")]
        )
    assert e.value.code == 2 and time.monotonic() - t0 < 30
    err = capsys.readouterr().err.strip()
    assert dead in err and "\n" not in err


def test_cli_with_a_dead_address_fails_in_one_line(monkeypatch, capsys, no_ray_init, tmp_path):
    dead = f"127.0.0.1:{_dead_port()}"
    rc = main(["--address", dead, "--set", f"checkpoint.storage_path={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 2 and no_ray_init == []
    assert err.count("\n") == 1 and err.startswith(f"error: no Ray cluster answers at {dead}")


# --------------------------------------------------------------------------- refused up front


def _sets(tmp: Path, data: Path, **extra: str) -> list[str]:
    sets = {
        "data.synthetic.preset": "seed902k",
        "data.synthetic.num_samples": "300",
        "data.synthetic.shards": "2",
        "data.synthetic.out_dir": str(data),
        "data.max_length": "64",
        "model.vocab_size": "64",
        "batching.token_budget": "1024",
        "train.epochs": "1",
        "wandb.mode": "disabled",
        "checkpoint.storage_path": str(tmp / "runs"),
        "checkpoint.run_name": "refused",
        "buckets.edges": "[0, 32, 64]",
        **extra,
    }
    return [w for k, v in sets.items() for w in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("driver-data") / "synthetic"


def _one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith(("error", "Trace"))]
    assert len(err) == 1, err
    return err[0]


def test_workers_that_leave_ray_data_no_cpu_are_refused(cluster, tmp_path, data_dir, capsys):
    sets = _sets(tmp_path, data_dir, **{"scaling.num_workers": "3"})
    assert main(sets) == 2
    assert _one_error_line(capsys) == (
        "error: 3 workers x 0.5 CPU + 1 CPU for Ray Data = 2.5 CPU > 2 in the cluster: lower "
        "scaling.num_workers (or scaling.min_workers) or scaling.cpus_per_worker (on a cluster "
        "that adds nodes on demand: scaling.autoscaling=true)"
    )


def test_a_resume_that_cannot_continue_is_refused_before_any_worker(
    cluster, tmp_path, data_dir, capsys
):
    """A checkpoint whose epoch plan differs from this run's (the data changed): refused on the
    driver with one line naming the checkpoint, so Ray Train never starts a worker."""
    cfg = load_config("configs/local.yaml", [s for s in _sets(tmp_path, data_dir) if s != "--set"])
    ckpt = tmp_path / "runs" / "refused" / "checkpoint_step00000005"
    ckpt.mkdir(parents=True)
    gb = global_batch_definition(cfg, cfg.buckets.edges)  # same batches, other plan: data changed
    pos = DataPosition(0, 5, "not-this-plan", 2, gb, 5)
    (ckpt / STATE_FILE).write_text(__import__("json").dumps({"position": pos.to_dict()}))
    assert main(_sets(tmp_path, data_dir)) == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: cannot resume: epoch 0's plan hash is") and str(ckpt) in line
    assert not (tmp_path / "runs" / "refused" / "checkpoint_manager_snapshot.json").exists()


def test_a_refused_resume_names_the_shard_that_changed(cluster, tmp_path, capsys):
    """A shard rewritten after a checkpoint (one row fewer): the refusal names that shard."""
    import pyarrow.parquet as pq

    from pipeline.data import build_length_index
    from pipeline.data.corpus import write_corpus
    from pipeline.data.driver import RunData, plan_run
    from pipeline.train.resume_check import data_file_digests

    data = tmp_path / "data"
    write_corpus(data, preset="seed902k", num_samples=300, shards=3, vocab_size=64)
    pairs = _sets(tmp_path, data, **{"data.path": str(data)})
    sets = [
        w
        for a, b in zip(pairs[::2], pairs[1::2], strict=True)
        if "synthetic" not in b
        for w in (a, b)
    ]
    cfg = load_config("configs/local.yaml", [s for s in sets if s != "--set"])
    index = build_length_index(cfg)
    edges = [int(e) for e in cfg.buckets.edges]
    plan = plan_run(cfg, RunData(str(data), index, edges), world_size=cfg.scaling.num_workers)
    pos = DataPosition(
        0, 5, plan.hashes[0], 2, global_batch_definition(cfg, edges), 5, data_file_digests(index)
    )
    ckpt = tmp_path / "runs" / "refused" / "checkpoint_step00000005"
    ckpt.mkdir(parents=True)
    (ckpt / STATE_FILE).write_text(__import__("json").dumps({"position": pos.to_dict()}))
    shard = sorted(data.glob("*.parquet"))[1]
    t = pq.read_table(shard)
    pq.write_table(t.slice(0, t.num_rows - 1), shard)
    assert main(sets) == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: cannot resume: epoch 0's plan hash is")
    assert f"(changed: {shard.name})" in line and str(ckpt) in line


def test_a_run_directory_in_use_is_refused(cluster, tmp_path, data_dir, capsys):
    rdir = tmp_path / "runs" / "refused"
    with RunLease(pafs.LocalFileSystem(), str(rdir), settle_s=0):
        assert main(_sets(tmp_path, data_dir)) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: run directory {rdir} is in use")


def test_driver_resume_check_reads_the_latest_complete_checkpoint(tmp_path):
    fs = pafs.LocalFileSystem()
    from pipeline.train.resume_check import latest_position

    assert latest_position(fs, str(tmp_path / "none")) is None
    for step, complete in ((5, True), (9, True), (12, False)):
        d = tmp_path / f"checkpoint_step{step:08d}"
        d.mkdir()
        if complete:
            pos = DataPosition(0, step, "h", 2, {}, step)
            (d / STATE_FILE).write_text(__import__("json").dumps({"position": pos.to_dict()}))
    path, pos = latest_position(fs, str(tmp_path))
    assert path.endswith("checkpoint_step00000009") and pos.steps_done == 9


# --------------------------------------------------------------------------- retries


def _decide(exc: BaseException):
    from ray.train import FailureConfig
    from ray.train.v2.api.exceptions import WorkerGroupError

    from pipeline.train.control import FatalUserErrorsPolicy

    policy = FatalUserErrorsPolicy(FailureConfig(max_failures=2))
    return policy.make_decision(WorkerGroupError("x", {0: RuntimeError("peer"), 1: exc})).value


def test_deterministic_worker_errors_are_not_retried():
    from pipeline.data import DataError

    assert _decide(ResumeError("data changed")) == "RAISE"
    assert _decide(DataError("bad row")) == "RAISE"
    assert _decide(ConfigError("bad betas")) == "RAISE"

    class NonFinite(RuntimeError):
        retryable = False

    assert _decide(NonFinite("loss is nan")) == "RAISE"
    assert _decide(RuntimeError("a lost worker")) == "RETRY"


def test_the_deterministic_error_is_unwrapped_for_the_cli():
    from ray.train.v2.api.exceptions import WorkerGroupError

    from pipeline.train.control import user_error

    err = ResumeError("cannot resume")
    assert user_error(WorkerGroupError("x", {0: RuntimeError("peer"), 1: err})) is err
    assert user_error(WorkerGroupError("x", {0: RuntimeError("lost")})) is None


# --------------------------------------------------------------------------- graceful stop


def test_the_trainer_installs_the_stop_handler_for_sigint_and_sigterm(tmp_path):
    from pipeline.train.control import trainer_class

    requests = []
    cls = trainer_class(lambda: requests.append("stop"))
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        cls._register_sigint_handler(None, controller=None)
        handler = signal.getsignal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) is handler and callable(handler)
        handler(signal.SIGTERM, None)
        assert requests == ["stop"]
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_an_elastic_run_that_refuses_resizing_is_refused_before_any_worker(
    tmp_path, data_dir, capsys, no_ray_init
):
    """The one world-size refusal only a worker could see (an elastic run resumed on fewer
    workers under plan.on_world_size_change=refuse) cannot arise: the config is refused first,
    in one line, before Ray is even joined (what a worker's ResumeError would do is covered by
    test_deterministic_worker_errors_are_not_retried)."""
    sets = _sets(
        tmp_path,
        data_dir,
        **{"scaling.min_workers": "1", "plan.on_world_size_change": "refuse"},
    )
    assert main(sets) == 2 and no_ray_init == []
    assert _one_error_line(capsys).startswith(
        "error: invalid config: scaling.min_workers=1 lets Ray Train resize the run, but "
        "plan.on_world_size_change=refuse stops a resized resume"
    )
