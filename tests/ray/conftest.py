"""One local Ray instance for the whole test session: start-up is the expensive part.

`address="local"` never attaches to another `ray start` on the machine, so a test cannot run
inside someone else's cluster. A module whose Ray processes must inherit environment variables
set by one of its fixtures (the S3 suite) swaps in its own instance with `private_ray`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import ray
import ray.data

# The `ray start` head of the job-submission tests, shared by test_submit_script.py (where it is
# defined) and test_job_submit.py.
from tests.ray.test_submit_script import ray_head  # noqa: F401


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
