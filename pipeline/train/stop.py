"""Stop requests: end a run early with a checkpoint (Ctrl-C, SIGTERM from spot preemption).

Ray Train runs the training function in a thread of the worker actor, so a worker cannot install
a signal handler, and the driver's signals never reach it. The driver asks instead, through a
small named actor, the stop flag:

    driver (before TorchTrainer.fit)              every worker (Trainer, each global step)
    flag = create_stop_flag(stop_flag_name(cfg))  rank 0 polls the flag (at most every poll_s,
                                                  and afresh before a checkpoint)
    on SIGINT/SIGTERM: request_stop(flag)         all ranks all-reduce "stop?" -> same step
    keep waiting on trainer.fit()                 finish the step, checkpoint, report, return

`fit()` then returns normally, and the final report carries `stopped=1` with the step it
stopped at; resubmitting resumes from that checkpoint. Without the actor (a driver that never
created it) the workers simply never see a request.

The flag also tells the workers that their driver is gone: it is owned by the driver and pinned
to its node, so once found, a flag that has died means the driver died (SIGKILL, its node lost).
Nobody would register another checkpoint then (the next attempt resumes from the last one Ray
Train registered), so rank 0's poll raises `DriverGoneError`, asked afresh before every
checkpoint, and every rank stops at the same step without writing one.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

__all__ = [
    "DriverGoneError",
    "StopFlag",
    "StopPoller",
    "create_stop_flag",
    "request_stop",
    "stop_flag_name",
    "stop_poller",
]


class DriverGoneError(RuntimeError):
    """The run's driver died: the workers stop without another checkpoint (module docstring)."""

    retryable = False


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


class StopPoller:
    """A worker's check of the flag actor `name`: `poller()` asks it at most every `poll_s`
    seconds, `poller.fresh()` now (before a checkpoint); never waits more than 10 s for an
    answer. A flag not found yet, or unreachable for a moment, reads as "no request"; a flag
    found once and then dead (or gone from the names) raises DriverGoneError."""

    def __init__(self, name: str, poll_s: float = 2.0):
        self.name, self.poll_s = name, poll_s
        self.next, self.stop, self.actor, self.seen = 0.0, False, None, False

    def __call__(self) -> bool:
        return self._poll(fresh=False)

    def fresh(self) -> bool:
        return self._poll(fresh=True)

    def _gone(self, why: str) -> DriverGoneError:
        return DriverGoneError(
            f"the run's driver is gone (its stop flag {self.name} {why}): stopping without "
            "another checkpoint; resubmit the run to resume from its last registered checkpoint"
        )

    def _poll(self, fresh: bool) -> bool:
        import ray
        from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

        now = time.monotonic()
        if self.stop or (now < self.next and not fresh):
            return self.stop
        self.next = now + self.poll_s
        if self.actor is None:
            try:
                self.actor = ray.get_actor(self.name)
            except ValueError:  # no such actor: not yet, or no longer
                if self.seen:
                    raise self._gone("no longer exists") from None
                return False
            self.seen = True
        try:
            self.stop = ray.get(self.actor.requested.remote(), timeout=10) is not None
        except ActorDiedError:
            raise self._gone("died") from None
        except (RayActorError, GetTimeoutError) as e:
            self.actor = None  # looked up again at the next poll
            log.warning(
                "stop flag %s unreachable (%s); no stop request seen", self.name, type(e).__name__
            )
        return self.stop


def stop_poller(name: str, poll_s: float = 2.0) -> StopPoller:
    """The poller of the flag actor `name` (see StopPoller)."""
    return StopPoller(name, poll_s)
