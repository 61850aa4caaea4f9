"""The stop flag (pipeline.train.stop): a request reaches the poller; a flag not created yet
reads as "no request"; a flag that died means the driver is gone (DriverGoneError)."""

from __future__ import annotations

import time

import pytest
import ray

from pipeline.train.stop import DriverGoneError, create_stop_flag, request_stop, stop_poller

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


def test_a_flag_not_created_yet_reads_as_no_request(cluster):
    poll = stop_poller("bucketray-stop-test-not-yet", poll_s=0.0)
    assert poll() is False and poll.fresh() is False
    flag = create_stop_flag("bucketray-stop-test-not-yet")
    try:
        request_stop(flag, "SIGTERM")
        ray.get(flag.requested.remote())
        assert poll() is True
    finally:
        ray.kill(flag)


def _wait_until_dead(actor, timeout_s: float = 30.0) -> None:
    from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.requested.remote(), timeout=10)
        except ActorDiedError:
            return
        except (RayActorError, GetTimeoutError):  # unavailable for a moment: not yet known dead
            pass
        time.sleep(0.1)
    raise AssertionError(f"the killed actor still answered after {timeout_s} s")


def test_a_flag_that_died_means_the_driver_is_gone(cluster):
    """The flag is owned by the driver and pinned to its node: once found, a dead flag is a
    driver that died (SIGKILL), and the workers must stop without another checkpoint."""
    flag = create_stop_flag("bucketray-stop-test-lost")
    poll = stop_poller("bucketray-stop-test-lost", poll_s=60.0)
    assert poll() is False  # the poller now holds the actor's handle
    ray.kill(flag, no_restart=True)
    assert poll() is False  # at its own pace: not asked again yet
    _wait_until_dead(flag)  # ray.kill returns before the actor is dead (a driver's death is past)
    with pytest.raises(DriverGoneError, match="driver is gone .* died"):
        poll.fresh()  # before a checkpoint: asked now
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the name is freed once GCS has the actor dead
        try:
            ray.get_actor("bucketray-stop-test-lost")
        except ValueError:
            break
        time.sleep(0.2)
    again = stop_poller("bucketray-stop-test-lost", poll_s=0.0)
    assert again() is False  # never found: not yet created, not gone
