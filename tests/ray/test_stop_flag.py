"""The stop flag (pipeline.train.stop): a request reaches the poller; a lost flag reads as "no
request" instead of failing the run's training function."""

from __future__ import annotations

import time

import pytest
import ray

from pipeline.train.stop import create_stop_flag, request_stop, stop_poller

pytestmark = pytest.mark.ray


def test_a_requested_stop_is_seen_by_the_poller(cluster):
    flag = create_stop_flag("bucketray-stop-test-seen")
    try:
        poll = stop_poller("bucketray-stop-test-seen", poll_s=0.0)
        assert poll() is False
        request_stop(flag, "SIGTERM")
        ray.get(flag.requested.remote())  # the request has landed
        assert poll() is True
    finally:
        ray.kill(flag)


def test_a_lost_stop_flag_reads_as_no_request_instead_of_failing(cluster):
    flag = create_stop_flag("bucketray-stop-test-lost")
    poll = stop_poller("bucketray-stop-test-lost", poll_s=0.0)
    assert poll() is False  # the poller now holds the actor's handle
    ray.kill(flag, no_restart=True)
    assert poll() is False  # RayActorError inside: swallowed, the run goes on
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the name is freed once GCS has the actor dead
        try:
            ray.get_actor("bucketray-stop-test-lost")
        except ValueError:
            break
        time.sleep(0.2)
    again = create_stop_flag("bucketray-stop-test-lost")  # a new driver makes a new flag
    try:
        request_stop(again, "SIGINT")
        ray.get(again.requested.remote())
        # Looked up again by name; for a moment the name may still answer with the killed
        # actor (GCS frees it asynchronously), which reads as "no request" meanwhile.
        deadline = time.monotonic() + 30
        while not poll() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert poll() is True
    finally:
        ray.kill(again)
