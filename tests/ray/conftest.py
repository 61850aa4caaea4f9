"""One local Ray instance for the whole test session: start-up is the expensive part.

`address="local"` never attaches to another `ray start` on the machine, so a test cannot run
inside someone else's cluster. A module whose Ray processes must inherit environment variables
set by one of its fixtures (the S3 suite) swaps in its own instance with `private_ray`. The
job-submission tests share `ray_head`, a token-authenticated `ray start` head of their own.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import ray
import ray.data

from tests.helpers import free_ports, http_status

VENV_BIN = Path(sys.executable).parent


def start_local_ray(**kw) -> object:
    ctx = ray.init(address="local", num_cpus=2, include_dashboard=False, **kw)
    ray.data.DataContext.get_current().enable_progress_bars = False
    return ctx


@contextmanager
def private_ray(**kw) -> Iterator[object]:
    """A fresh local instance for one module; the next module that asks for `cluster` starts
    the shared one again."""
    ray.shutdown()
    try:
        yield start_local_ray(**kw)
    finally:
        ray.shutdown()


@contextmanager
def three_node_cluster() -> Iterator[tuple]:
    """A simulated cluster (`ray.cluster_utils.Cluster`) joined by this process: a head with no
    CPUs (driver and feeder only) and two 1-CPU nodes running every read, sort and split task,
    so each holds part of every pass's blocks. Yields (cluster, [the two worker nodes]); a Ray
    this session started before is shut down first, as `private_ray` does."""
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    try:
        nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
        ray.init(address=cluster.address, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="session")
def _shutdown_ray_at_exit():
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def cluster(_shutdown_ray_at_exit):
    """The session's shared local instance, started by the first module that needs it (and
    again after a module that used a private one)."""
    if not ray.is_initialized():
        start_local_ray()


@pytest.fixture(scope="session")
def tiny_run(_shutdown_ray_at_exit, tmp_path_factory):
    """The tiny run (`tests.helpers.tiny_raw`: 2 epochs, 2 workers) trained once per session,
    with a held-out evaluation every 10 steps and at each epoch end, its metrics and every
    trained sample id recorded: `test_train_e2e` checks the run,
    `test_resume` compares a failed and restarted run with it. Returns (cfg, summary, metrics
    as a list of dicts, its tmp dir)."""
    import json

    from pipeline.core.config import validate
    from pipeline.train.launch import run
    from tests.helpers import tiny_raw, write_held_out

    if not ray.is_initialized():
        start_local_ray()
    tmp = tmp_path_factory.mktemp("e2e")
    cfg = validate(
        tiny_raw(
            tmp,
            train={
                "metrics_file": str(tmp / "metrics.jsonl"),
                "record_sample_ids": str(tmp / "ids"),
            },
            checkpoint={"run_name": "e2e"},
            eval={"path": write_held_out(tmp / "held_out"), "every_steps": 10},
        )
    )
    summary = run(cfg)
    metrics = [json.loads(x) for x in (tmp / "metrics.jsonl").read_text().splitlines()]
    return cfg, summary, metrics, tmp


@pytest.fixture(scope="module")
def ray_head():
    """A `ray start --head --block` of our own, with token auth on, its own ports and temp dir.

    Stopped through that process only, not with `ray stop`, which ends every Ray process on the
    machine, other suites' clusters included. Its own --temp-dir keeps `ray.init()`
    elsewhere from discovering this head through /tmp/ray.
    """
    tmp = Path(tempfile.mkdtemp(prefix="brsub-", dir="/tmp"))  # short: Ray's socket paths
    token_path = tmp / "auth_token"
    token_path.write_text(secrets.token_hex(32))
    token_path.chmod(0o600)
    gcs, dashboard, agent, client = free_ports(4)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token_path),
        WANDB_MODE="disabled",
    )
    cmd = [
        str(VENV_BIN / "ray"), "start", "--head", "--block",
        "--num-cpus=2",
        f"--port={gcs}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={agent}",
        f"--ray-client-server-port={client}",
        f"--temp-dir={tmp / 'ray'}",
    ]  # fmt: skip
    log = open(tmp / "ray_start.log", "w")
    head = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 180  # a loaded 2-core machine can take minutes
        while http_status(f"{address}/api/jobs/", token_path.read_text()) != 200:
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"ray head did not come up:\n{(tmp / 'ray_start.log').read_text()[-3000:]}"
                )
            time.sleep(1)
        yield {"address": address, "env": env, "token": token_path.read_text()}
    finally:
        # SIGTERM to `ray start` alone: its handler stops the node's processes in order (~5 s on
        # an idle node; signalling the whole group left the autoscaler monitor hanging). After a
        # training job it can take longer; then the group, which holds every process this head
        # started, is killed outright.
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
