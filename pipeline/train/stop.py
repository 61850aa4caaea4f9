"""Stop requests: end a run early with a checkpoint (Ctrl-C, SIGTERM from spot preemption).

Ray Train runs the training function in a thread of the worker actor, so a worker cannot install
a signal handler, and the driver's signals never reach it. The driver asks instead, through a
small named actor, the stop flag:

    driver (before TorchTrainer.fit)              every worker (Trainer, each global step)
    flag = create_stop_flag(stop_flag_name(cfg))  rank 0 polls the flag (at most every poll_s)
    on SIGINT/SIGTERM: request_stop(flag)         all ranks all-reduce "stop?" -> same step
    keep waiting on trainer.fit()                 finish the step, checkpoint, report, return

`fit()` then returns normally, and the final report carries `stopped=1` with the step it
stopped at; resubmitting resumes from that checkpoint. Without the actor (a driver that never
created it) the workers simply never see a request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = ["StopFlag", "stop_flag_name", "create_stop_flag", "request_stop", "stop_poller"]


def stop_flag_name(run_name: str) -> str:
    """The flag actor's name for the run `checkpoint.run_name` (one run per name at a time)."""
    return f"bucketray-stop-{run_name}"


class StopFlag:
    """Actor body: a reason string once a stop is requested, None before."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason

    def requested(self) -> str | None:
        return self.reason


def create_stop_flag(name: str):
    """The driver's side: start the named flag actor (0 CPUs; it dies with the driver), or get
    this driver's own if it already made one (a caller that wants to stop the run early).

    Pinned to the driver's node: a zero-CPU actor may otherwise be placed on any node, and a
    flag on a worker node that is lost would take the run's stop requests with it."""
    import ray

    from pipeline.data.connect import on_this_node

    return (
        ray.remote(num_cpus=0)(StopFlag)
        .options(name=name, get_if_exists=True, scheduling_strategy=on_this_node())
        .remote()
    )


def request_stop(flag, reason: str = "stop requested") -> None:
    """Ask every worker to stop after its current step; `flag` is a handle or the actor's name.
    Safe to call from a signal handler (it does not wait for the actor)."""
    import ray

    if isinstance(flag, str):
        flag = ray.get_actor(flag)
    flag.request.remote(reason)


def stop_poller(name: str, poll_s: float = 2.0) -> Callable[[], bool]:
    """A worker's check of the flag actor `name`: asks it at most every `poll_s` seconds, never
    waits more than 10 s for an answer, and reads "no request" while the actor does not exist
    or after it was lost (with its node or its driver): losing the flag must not fail a run
    that Ray Train can still restart."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    state = {"next": 0.0, "stop": False, "actor": None}

    def poll() -> bool:
        now = time.monotonic()
        if state["stop"] or now < state["next"]:
            return state["stop"]
        state["next"] = now + poll_s
        if state["actor"] is None:
            try:
                state["actor"] = ray.get_actor(name)
            except ValueError:  # no such actor (yet)
                return False
        try:
            state["stop"] = ray.get(state["actor"].requested.remote(), timeout=10) is not None
        except (RayActorError, GetTimeoutError) as e:
            state["actor"] = None  # looked up again at the next poll (a new driver makes a new one)
            log.warning(
                "stop flag %s unreachable (%s); no stop request seen", name, type(e).__name__
            )
        return state["stop"]

    return poll
