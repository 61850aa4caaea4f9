"""Contracts 7 and 8 when a node is lost: a simulated two-node cluster (`ray.cluster_utils`) with
one training worker per node, and the worker node removed mid-epoch.

What Ray Train V2 (2.60) does, measured here: with a fixed `num_workers` it keeps the run waiting
for capacity (it retries the worker-group start; `FailureConfig.controller_failure_limit` is -1 by
default, so it waits indefinitely) and finishes with the same world size once a node returns;
with an elastic `num_workers=(min, max)` it restarts on what remains, and our loop resumes with
the same global batches (contract 8, `plan.on_world_size_change=keep_order`); an elastic run that
forbids resizing (`refuse`) is refused when its config loads. The config reaches both:
`scaling.min_workers` makes the run elastic, and `scaling.resources_per_worker` pins one worker
per node with a resource only worker nodes have.
"""

from __future__ import annotations

import threading
import time

import pytest
import ray
import ray.train
from ray._private.state import actors as actor_table
from ray.cluster_utils import Cluster

from pipeline.core.config import ConfigError
from pipeline.train.launch import run
from pipeline.train.stop import create_stop_flag
from tests.faults.conftest import (
    assert_exact_recovery,
    attempts,
    fault_config,
    kill_when,
    read_records,
    report,
    trained_steps,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SLOT = "bucketray_train_slot"  # one per worker node: one training worker per node
PENDING_S = 15  # how long the fixed-size run is watched waiting after the loss


@pytest.fixture
def two_nodes():
    """Head (driver, feeder, Ray Data; no slot) + two 1-CPU worker nodes with one slot each."""
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False}
    )
    nodes = [cluster.add_node(num_cpus=1, resources={SLOT: 1}) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    cluster.wait_for_nodes()
    yield cluster, nodes
    ray.shutdown()
    cluster.shutdown()


def _scaling(*, elastic: bool) -> list[str]:
    """Overrides: each worker also takes one SLOT; `elastic` lets the run go down to 1 worker."""
    return [f"scaling.resources_per_worker={{{SLOT}: 1}}"] + (
        ["scaling.min_workers=1"] if elastic else []
    )


def _run_in_thread(cfg) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def target():
        t0 = time.monotonic()
        try:
            out["summary"] = run(cfg)
        except Exception as e:  # surfaced by the test
            out["error"] = e
        out["seconds"] = time.monotonic() - t0

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, out


def test_the_stop_flag_lives_on_the_driver_node(two_nodes):
    """A zero-CPU actor may land on any node; the stop flag must not be lost with a worker
    node (a fixed-size run then failed twice: once for the node, once for the flag)."""
    driver_node = ray.get_runtime_context().get_node_id()
    flags = [create_stop_flag(f"bucketray-stop-placement-{i}") for i in range(8)]
    try:
        ray.get([f.requested.remote() for f in flags])  # all started
        # GCS's actor table (the state API needs a dashboard, which this cluster has none of).
        placed = [actor_table(f._actor_id.hex())["Address"]["NodeID"] for f in flags]
        assert set(placed) == {driver_node}, placed
    finally:
        for f in flags:
            ray.kill(f)


def test_contract7_lost_node_fixed_size_waits_then_resumes_exact_batches(
    two_nodes, reference, fault_data, tmp_path
):
    cluster, nodes = two_nodes
    cfg = fault_config(fault_data, tmp_path, "lost-node-fixed", *_scaling(elastic=False))
    watcher, info = kill_when(
        tmp_path / "ids", after_steps=25, rank=1, kill=lambda pid: cluster.remove_node(nodes[1])
    )
    fit, out = _run_in_thread(cfg)
    deadline = time.monotonic() + 600
    while "t" not in info and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "t" in info, "the node was never removed"

    # One node of slots left for two workers: the run waits, it does not shrink or fail.
    time.sleep(PENDING_S)
    recs = read_records(tmp_path / "ids")
    assert fit.is_alive() and len(attempts(recs, 0)) == 1, "expected the run to wait for capacity"
    waited_at = trained_steps(recs)

    t_add = time.monotonic()
    cluster.add_node(num_cpus=1, resources={SLOT: 1})  # the replacement node
    fit.join(timeout=600)
    assert "summary" in out, out.get("error")
    recs = read_records(tmp_path / "ids")
    rec = assert_exact_recovery(recs, reference["records"])
    assert rec.world_after == 2 and rec.resumed_at <= info["steps_at_kill"] <= waited_at
    assert out["summary"].steps == reference["summary"].steps
    report(
        "lost_node_fixed",
        removed_after=info["steps_at_kill"],
        resumed_at=rec.resumed_at,
        rerun_steps=rec.rerun_steps,
        waited_s=round(t_add - info["t"], 1),
        replacement_to_end_s=round(time.monotonic() - t_add, 1),
    )


def test_contract8_lost_node_elastic_resumes_on_one_worker_same_global_batches(
    fault_case, two_nodes, tmp_path
):
    """Global and windowed (the node lost, and the run resumed, inside the second window)."""
    cluster, nodes = two_nodes  # after fault_case: its reference runs start a Ray of their own
    case, ref = fault_case, fault_case.reference
    cfg = fault_config(
        case.data, tmp_path, "lost-node-elastic", *_scaling(elastic=True), *case.extra
    )
    watcher, info = kill_when(
        tmp_path / "ids",
        after_steps=case.kill_after,
        rank=1,
        kill=lambda pid: cluster.remove_node(nodes[1]),
    )
    fit, out = _run_in_thread(cfg)
    fit.join(timeout=900)
    watcher.join(timeout=60)
    assert "summary" in out, out.get("error")
    recs = read_records(tmp_path / "ids")
    rec = assert_exact_recovery(recs, ref["records"])
    assert rec.world_after == 1  # resized: rank 0 alone trains each whole global batch
    assert out["summary"].steps == ref["summary"].steps
    assert out["summary"].samples == ref["summary"].samples
    case.assert_inside_a_later_window(info["steps_at_kill"])  # the node lost there
    case.assert_inside_a_later_window(rec.resumed_at)  # and the resumed run started there
    report(
        "lost_node_elastic" + ("_windowed" if case.windowed else ""),
        removed_after=info["steps_at_kill"],
        resumed_at=rec.resumed_at,
        rerun_steps=rec.rerun_steps,
        recovery_s=info.get("recovery_s"),
        world_after=rec.world_after,
    )


def test_contract8_lost_node_elastic_refuses_when_config_forbids_resizing(fault_data, tmp_path):
    """An elastic run (scaling.min_workers) that also forbids resizing would only find out in a
    restarted worker, after a node is lost; the config refuses the combination up front."""
    with pytest.raises(ConfigError, match="scaling.min_workers=1 lets Ray Train resize the run"):
        fault_config(
            fault_data,
            tmp_path,
            "lost-node-refuse",
            "plan.on_world_size_change=refuse",
            *_scaling(elastic=True),
        )
