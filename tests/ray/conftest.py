"""One local Ray cluster per test module (RAY_NOTES: start-up is the expensive part)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import ray
import ray.data


@contextmanager
def local_ray(**kw) -> Iterator[object]:
    """A fresh 2-CPU cluster. address="local" never attaches to another `ray start` on the
    machine, so a test cannot run inside someone else's cluster."""
    ctx = ray.init(address="local", num_cpus=2, include_dashboard=False, **kw)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield ctx
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def cluster():
    with local_ray() as ctx:
        yield ctx
