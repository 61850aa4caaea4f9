"""How the driver steers a Ray Train run: which failures to retry, and how to stop it gracefully.

- Deterministic errors (a config, data or resume problem, a non-finite loss) fail the same way
  on every retry. `FatalUserErrorsPolicy` makes Ray Train raise them at the first failure instead
  of spending every `checkpoint.max_failures` attempt, and `user_error` takes them back out of
  Ray's `WorkerGroupError` so the CLI can print their one line.
- SIGINT / SIGTERM (Ctrl-C, a spot preemption, `ray job stop`) during `fit()` first ask the
  workers to stop gracefully (through the run's stop flag, `pipeline.train.stop`); a second signal aborts
  the run the way Ray Train does (no checkpoint); a third exits at once.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

from pipeline.core.config import ConfigError
from pipeline.train.runlock import make_stop_handler

__all__ = ["FatalUserErrorsPolicy", "is_deterministic", "trainer_class", "user_error"]


def _deterministic_types() -> tuple[type[BaseException], ...]:
    from pipeline.data import DataError
    from pipeline.learn.checkpoint import CheckpointError, ResumeError

    return (ConfigError, DataError, ResumeError, CheckpointError)


def is_deterministic(exc: BaseException) -> bool:
    """An error a retry cannot change: one of the user error classes, or any exception class
    that says so with `retryable = False` (e.g. the worker loop's non-finite-loss error)."""
    exc = getattr(exc, "_base_exc", exc)  # Ray's UserExceptionWithTraceback wrapper
    return getattr(exc, "retryable", True) is False or isinstance(exc, _deterministic_types())


def user_error(err: BaseException) -> BaseException | None:
    """The deterministic worker error inside a Ray Train failure, if there is one."""
    failures = getattr(err, "worker_failures", None) or {}
    for rank in sorted(failures):
        exc = getattr(failures[rank], "_base_exc", failures[rank])
        if is_deterministic(exc):
            return exc
    return None


def _default_policy_class():
    from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy

    return DefaultFailurePolicy


class FatalUserErrorsPolicy(_default_policy_class()):
    """Ray Train's default failure policy, except that a worker group failing with a
    deterministic error is raised at once rather than retried."""

    def make_decision(self, training_failed_error):
        from ray.train.v2._internal.execution.failure_handling import FailureDecision

        if user_error(training_failed_error) is not None:
            return FailureDecision.RAISE
        return super().make_decision(training_failed_error)


def trainer_class(request: Callable[[], object]):
    """A TorchTrainer that retries only what a retry can fix, and whose SIGINT/SIGTERM handler
    asks for a graceful stop through `request` before aborting."""
    from ray.train.torch import TorchTrainer

    class BucketrayTrainer(TorchTrainer):
        def _initialize_and_run_controller(self, **kw):
            if "failure_policy" in kw:
                kw["failure_policy"] = FatalUserErrorsPolicy(self.run_config.failure_config)
            return super()._initialize_and_run_controller(**kw)

        def _register_sigint_handler(self, controller):
            import ray

            def abort() -> None:
                try:
                    ray.get(controller.abort.remote())
                except ray.exceptions.RayActorError:
                    sys.exit(130)

            handler = make_stop_handler(request, abort)
            signal.signal(signal.SIGINT, handler)
            signal.signal(signal.SIGTERM, handler)

    return BucketrayTrainer
