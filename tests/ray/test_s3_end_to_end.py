"""Object storage end to end: shards, the length index cache, checkpoints and resume on s3://,
against a real S3 server (moto's server mode) on 127.0.0.1 that this module starts itself.

Credentials and the endpoint come from the environment only (AWS_* variables), as on a cluster;
the configs name nothing but s3:// URIs, and the row cache's local directory (files to
memory-map are on the driver's node whatever the data's storage).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest
import ray
import ray.train

import pipeline.data.index
from jobs import evaluate as evaluate_job
from pipeline.core.config import validate
from pipeline.data import build_length_index, epoch_plan_for, resolve_edges
from pipeline.data.corpus import write_corpus
from pipeline.data.index import filesystem_for
from pipeline.learn.checkpoint import load_checkpoint
from pipeline.train.history import StepHistory
from pipeline.train.launch import run
from pipeline.train.loop import FAIL_AT_STEP_ENV, FAIL_MARKER_ENV
from pipeline.train.run_picture import draw_run
from tests.helpers import free_ports, write_held_out
from tests.ray.conftest import private_ray

pytestmark = pytest.mark.ray

BUCKET = "bkt"
CORPUS = f"s3://{BUCKET}/corpus"
RUNS = f"s3://{BUCKET}/runs"
# Distinctive dummy credentials (moto accepts any), so a leak is found by a plain byte search.
ACCESS_KEY = "AKIABUCKETRAYTEST0001"
SECRET_KEY = "bucketray-dummy-secret-must-never-be-written"
CHECKPOINT_EVERY, FAIL_AFTER, MAX_STEPS = 4, 6, 10


def _wait_until_answers(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"moto server did not answer at {url} within {timeout_s} s")


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory):
    """A moto S3 server on a free loopback port, and the AWS_* environment pointing at it."""
    (port,) = free_ports(1)
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_answers(endpoint, proc)
        with pytest.MonkeyPatch.context() as mp:
            # Set before ray.init, so every Ray process of this module's cluster inherits it.
            for k, v in {
                "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": endpoint,
            }.items():
                mp.setenv(k, v)
            mp.delenv("AWS_SESSION_TOKEN", raising=False)
            mp.delenv("AWS_PROFILE", raising=False)
            yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def s3(s3_env) -> pafs.S3FileSystem:
    """The bucket, created once; the filesystem is resolved from the environment like the code's."""
    # pyarrow 26: FileSystem.from_uri honours AWS_ENDPOINT_URL, the S3FileSystem() constructor
    # does not, so the bucket-creating one names the endpoint (keys and region: environment).
    admin = pafs.S3FileSystem(endpoint_override=s3_env, allow_bucket_creation=True)
    admin.create_dir(BUCKET)
    fs, _ = pafs.FileSystem.from_uri(CORPUS)
    return fs


@pytest.fixture(scope="module")
def cluster(s3_env):
    # A Ray instance of this module's own, started after s3_env so every Ray process inherits
    # the endpoint and keys; the next module asking for `cluster` starts the shared one again.
    with private_ray() as ctx:
        yield ctx


@pytest.fixture(scope="module")
def corpus(s3, tmp_path_factory) -> str:
    """A small synthetic corpus written locally, then uploaded to s3://bkt/corpus."""
    local = tmp_path_factory.mktemp("corpus")
    write_corpus(local, num_samples=600, shards=2, vocab_size=64, seed=0, progress=False)
    pafs.copy_files(str(local), CORPUS.removeprefix("s3://"), destination_filesystem=s3)
    return CORPUS


def tiny_config(tmp: Path, name: str) -> dict:
    return {
        "data": {
            "path": CORPUS,
            "max_length": 64,
            "over_length": "truncate",
        },
        "delivery": {"row_cache_dir": str(tmp / "rows")},
        "buckets": {"num_buckets": 2},
        "batching": {"token_budget": 1024},
        "model": {"vocab_size": 64, "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64},
        "train": {
            "epochs": 1,
            "max_steps": MAX_STEPS,
            "lr": 1e-2,
            "warmup_steps": 2,
            "log_every": 2,
            "record_sample_ids": str(tmp / "ids"),
        },
        "wandb": {"mode": "disabled"},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "checkpoint": {
            "storage_path": RUNS,
            "run_name": name,
            "every_steps": CHECKPOINT_EVERY,
            "max_failures": 0,
        },
    }


def _objects(fs: pafs.FileSystem, prefix: str) -> list[str]:
    return sorted(
        f.path
        for f in fs.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
        if f.type == pafs.FileType.File
    )


def _records(ids_dir: Path) -> list[dict]:
    return [
        json.loads(x)
        for f in sorted(ids_dir.glob("rank*.jsonl"))
        for x in f.read_text().splitlines()
    ]


def test_driver_resolved_filesystem_carries_the_endpoint_but_no_credentials(s3_env):
    # The driver resolves s3:// once and ships the filesystem to the index scan, the feeder and
    # Ray Train, so only the driver needs AWS_ENDPOINT_URL; each process finds its own keys.
    fs, path = filesystem_for(CORPUS)
    assert path == f"{BUCKET}/corpus"
    shipped = pickle.dumps(fs)
    assert s3_env.encode() in shipped
    assert ACCESS_KEY.encode() not in shipped and SECRET_KEY.encode() not in shipped


def test_length_index_from_s3_is_cached_in_the_bucket(cluster, s3, corpus, tmp_path):
    cfg = validate(tiny_config(tmp_path, "index-only"))
    first = build_length_index(cfg, corpus)
    assert first.num_samples == 600 and not first.from_cache
    assert all(f.startswith(f"{BUCKET}/corpus/shard-") for f in first.files)
    cached = _objects(s3, f"{BUCKET}/corpus/_bucketray_index")
    assert cached == [f"{BUCKET}/corpus/_bucketray_index/index-{first.fingerprint}.parquet"]

    second = build_length_index(cfg, corpus)
    assert second.from_cache
    np.testing.assert_array_equal(second.sample_ids, first.sample_ids)
    np.testing.assert_array_equal(second.lengths, first.lengths)


# Two runs against the bucket (~70 s): make test-slow. The default suite keeps contract 7 on local
# storage (test_resume.py), the index cache in the bucket and the driver-resolved filesystem here.
@pytest.mark.slow
def test_killed_run_resumes_from_the_bucket_with_the_planned_batches(
    cluster, s3, corpus, tmp_path, monkeypatch, capfd
):
    name = "s3-resume"
    cfg = validate(tiny_config(tmp_path, name))

    # First run: dies right after global step FAIL_AFTER; Ray Train may not restart it.
    monkeypatch.setenv(FAIL_AT_STEP_ENV, str(FAIL_AFTER))
    monkeypatch.setenv(FAIL_MARKER_ENV, str(tmp_path / "failed-once"))
    with pytest.raises(ray.train.TrainingFailedError, match="injected failure"):
        run(cfg)
    monkeypatch.delenv(FAIL_AT_STEP_ENV)
    monkeypatch.delenv(FAIL_MARKER_ENV)
    run_prefix = f"{BUCKET}/runs/{name}"
    assert f"{run_prefix}/checkpoint_step{CHECKPOINT_EVERY:08d}/state.json" in _objects(
        s3, run_prefix
    )
    assert _objects(s3, f"{BUCKET}/corpus/_bucketray_index"), "no index cache in the bucket"
    assert list((tmp_path / "rows").glob("*.arrow")), "no row cache on the driver's node"

    # Second run, same run name: the index comes from the cache (a rescan would fail here) and
    # training continues from the bucket's latest checkpoint.
    def no_rescan(*args, **kwargs):
        raise AssertionError("the length index was rescanned instead of read from the cache")

    scan = pipeline.data.index._scan_all
    monkeypatch.setattr(pipeline.data.index, "_scan_all", no_rescan)
    resumed = run(cfg)
    assert resumed.steps == MAX_STEPS

    objects = _objects(s3, run_prefix)
    ckpts = sorted({p.split("/")[3] for p in objects if p.endswith("/state.json")})
    assert ckpts == [f"checkpoint_step{s:08d}" for s in (4, 8, 10)]

    # Every rank restarted at the checkpointed step, and trained exactly the planned batches.
    recs = _records(tmp_path / "ids")
    starts = sorted((r["rank"], r["step"]) for r in recs if r.get("event") == "start")
    assert starts == [(0, 0), (0, CHECKPOINT_EVERY), (1, 0), (1, CHECKPOINT_EVERY)]
    index = build_length_index(cfg, corpus)
    plan = epoch_plan_for(cfg, index, resolve_edges(cfg, index.lengths), 0, 2)
    planned = {}
    for rank in (0, 1):
        view = plan.rank_view(rank)
        for i, step in enumerate(view.steps.tolist()):
            if step < MAX_STEPS:
                ids = view.sample_ids[view.offsets[i] : view.offsets[i + 1]]
                planned[(0, step, rank)] = ids.tolist()
    after_restart = {}
    for rank in (0, 1):
        mine = [r for r in recs if r["rank"] == rank]
        restart = max(i for i, r in enumerate(mine) if r.get("event") == "start")
        after_restart.update({(r["epoch"], r["step"], rank): r["ids"] for r in mine[restart + 1 :]})
    assert after_restart == {k: v for k, v in planned.items() if k[1] >= CHECKPOINT_EVERY}

    # The summary names the final checkpoint by URI; read back from the bucket, it holds the end.
    assert resumed.checkpoint == f"{RUNS}/{name}/checkpoint_step{MAX_STEPS:08d}"
    local = tmp_path / "final"
    local.mkdir()
    pafs.copy_files(resumed.checkpoint, str(local), destination_filesystem=pafs.LocalFileSystem())
    assert load_checkpoint(local).position.steps_done == MAX_STEPS

    # The run's picture lies beside its checkpoints in the bucket, and `jobs.plot_run` draws it
    # again from the storage path alone (every step of both attempts, the lost ones replaced).
    assert resumed.picture == f"{RUNS}/{name}/run.png"
    assert f"{run_prefix}/run.png" in objects
    out = tmp_path / "again.png"
    assert draw_run(f"{RUNS}/{name}", str(out)) == str(out)
    assert out.read_bytes().startswith(b"\x89PNG")
    assert StepHistory.read_dir(str(local)).arrays()["step"].tolist() == list(
        range(1, MAX_STEPS + 1)
    )

    # jobs.evaluate reads the final checkpoint's weights from the bucket on both workers (each
    # its own copy of model.pt and the config, never the optimizer's state); the held-out set is
    # new, so its lengths are scanned.
    monkeypatch.setattr(pipeline.data.index, "_scan_all", scan)
    held = write_held_out(tmp_path / "held", n=20)
    figures = tmp_path / "eval.json"
    args = [f"{RUNS}/{name}", "--set", f"eval.path={held}", "--json", str(figures)]
    assert evaluate_job.main(args) == 0
    assert json.loads(figures.read_text())["eval/samples"] == 20

    # No credential in the bucket's run objects, the config, the run's output or Ray's logs.
    secrets = (ACCESS_KEY.encode(), SECRET_KEY.encode())
    for path in objects:
        with s3.open_input_stream(path) as f:
            data = f.read()
        assert not any(s in data for s in secrets), path
    assert not any(s.decode() in cfg.model_dump_json() for s in secrets)
    out = capfd.readouterr()
    assert not any(s.decode() in out.out + out.err for s in secrets)
    logs = Path(cluster.address_info["session_dir"]) / "logs"
    for f in [*logs.rglob("*"), *(tmp_path / "ids").glob("*")]:
        if f.is_file():
            assert not any(s in f.read_bytes() for s in secrets), f
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == SECRET_KEY  # the search looked for the real one
