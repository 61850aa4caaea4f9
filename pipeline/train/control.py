"""How the driver steers a Ray Train run: which failures to retry, and how to stop it gracefully.

- Deterministic errors (a config, data or resume problem, a model that cannot be built, a
  non-finite loss, storage that refuses the write: disk full, read-only, permission denied, a
  missing file) fail the same way on every retry, wherever they are raised: on the driver, in
  the feeder actor (reaching a worker wrapped in Ray's RayTaskError) or in a worker. `FatalUserErrorsPolicy` makes Ray Train raise them at the first failure instead
  of spending every `checkpoint.max_failures` attempt, and `user_error` takes them back out of
  Ray's `WorkerGroupError` so the CLI can print their one line.
- SIGINT / SIGTERM (Ctrl-C, a spot preemption, `ray job stop`) during `fit()` first ask the
  workers to stop gracefully (through the run's stop flag, `pipeline.train.stop`); a second signal aborts
  the run the way Ray Train does (no checkpoint) and ends the driver with a closing line; a
  third exits at once.
The Ray internals this relies on (private, unversioned API of Ray Train V2) are used in this
module only and listed in `RAY_PRIVATE_API`; `ray_private_api_problems()` checks them against the
installed Ray, and tests/unit/test_ray_private_api.py fails with its message after a Ray upgrade
that moved any of them.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable, Iterator

from pipeline.core.config import ConfigError
from pipeline.train.runlock import make_stop_handler

__all__ = [
    "RAY_PRIVATE_API",
    "RAY_PRIVATE_API_CHECKED_WITH",
    "FatalUserErrorsPolicy",
    "deterministic_cause",
    "is_deterministic",
    "is_permanent_os_error",
    "ray_private_api_problems",
    "trainer_class",
    "user_error",
]

# The Ray release these internals were read in and tested against.
RAY_PRIVATE_API_CHECKED_WITH = "2.60.0"
# What this module relies on beyond Ray's public API, and what breaks without it.
RAY_PRIVATE_API = {
    "ray.train.v2._internal.execution.failure_handling.DefaultFailurePolicy(failure_config)"
    ".make_decision(training_failed_error)": "FatalUserErrorsPolicy subclasses it",
    "ray.train.v2._internal.execution.failure_handling.FailureDecision.RAISE": "no retry of a "
    "deterministic error",
    "TorchTrainer._initialize_and_run_controller(**kw) receives failure_policy=": "installs "
    "FatalUserErrorsPolicy",
    "TorchTrainer._register_sigint_handler(controller)": "the graceful stop on SIGINT/SIGTERM",
    "TrainController.abort()": "the second signal aborts the run",
    "WorkerGroupError.worker_failures, UserExceptionWithTraceback._base_exc": "user_error finds "
    "the worker's own exception",
}


# Storage errors a retry cannot fix: the same write or open fails the same way until a person
# frees space, fixes permissions or restores the file. (Transient ones -- throttling, resets,
# timeouts -- carry no errno or another one, and are retried by pipeline.data.retry.)
PERMANENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT}
)
# pyarrow's filesystems raise OSError without an errno, with the C library's text in the message.
_PERMANENT_TEXTS = tuple(os.strerror(n) for n in sorted(PERMANENT_ERRNOS))


def _deterministic_types() -> tuple[type[BaseException], ...]:
    from pipeline.data import DataError
    from pipeline.learn.checkpoint import CheckpointError, ResumeError

    return (ConfigError, DataError, ResumeError, CheckpointError)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it wraps: Ray's UserExceptionWithTraceback (`_base_exc`), a RayTaskError
    from the feeder (`cause`), Ray Train's ControllerError (a worker group that could not
    start), then the explicit `raise ... from` causes."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = (
            getattr(exc, "_base_exc", None)
            or getattr(exc, "cause", None)
            or getattr(exc, "controller_failure", None)  # Ray Train's ControllerError
            or exc.__cause__
        )


def is_permanent_os_error(exc: BaseException) -> bool:
    """Disk full, quota, read-only, permission denied or a missing file (see PERMANENT_ERRNOS)."""
    if not isinstance(exc, OSError):
        return False
    if exc.errno is not None:
        return exc.errno in PERMANENT_ERRNOS
    return any(t in str(exc) for t in _PERMANENT_TEXTS)


def _deterministic_one(exc: BaseException) -> bool:
    if getattr(exc, "retryable", True) is False or isinstance(exc, _deterministic_types()):
        return True
    return is_permanent_os_error(exc)


def is_deterministic(exc: BaseException) -> bool:
    """An error a retry cannot change: one of the user error classes, any exception class that
    says so with `retryable = False` (e.g. the worker loop's non-finite-loss error), or a
    permanent storage error -- found in `exc` or anything it wraps (see `_chain`), including
    the per-rank failures of Ray Train's WorkerGroupError."""
    return deterministic_cause(exc) is not None


def deterministic_cause(exc: BaseException) -> BaseException | None:
    """The first deterministic error in `exc`'s chain (or in a failed rank's), for the CLI's
    one line; None when a retry may help."""
    for e in _chain(exc):
        if _deterministic_one(e):
            return e
        failures = getattr(e, "worker_failures", None) or {}
        for rank in sorted(failures):
            found = deterministic_cause(failures[rank])
            if found is not None:
                return found
    return None


def user_error(err: BaseException) -> BaseException | None:
    """The deterministic worker error inside a Ray Train failure, if there is one."""
    return deterministic_cause(err)


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
                    pass  # the controller exits as it aborts

            handler = make_stop_handler(request, abort)
            signal.signal(signal.SIGINT, handler)
            signal.signal(signal.SIGTERM, handler)

    return BucketrayTrainer


def ray_private_api_problems() -> list[str]:
    """What of RAY_PRIVATE_API the installed Ray no longer has (empty when all is there)."""
    import inspect

    import ray
    from ray.train.torch import TorchTrainer

    problems: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    try:
        from ray.train.v2._internal.execution.failure_handling import (
            DefaultFailurePolicy,
            FailureDecision,
        )
    except ImportError as e:
        return [f"ray.train.v2._internal.execution.failure_handling: {e}"]
    need(hasattr(FailureDecision, "RAISE"), "FailureDecision.RAISE")
    params = list(inspect.signature(DefaultFailurePolicy.make_decision).parameters)
    need(params == ["self", "training_failed_error"], f"DefaultFailurePolicy.make_decision{params}")
    init = list(inspect.signature(DefaultFailurePolicy.__init__).parameters)
    need(init == ["self", "failure_config"], f"DefaultFailurePolicy.__init__{init}")
    run = getattr(TorchTrainer, "_initialize_and_run_controller", None)
    need(run is not None, "TorchTrainer._initialize_and_run_controller")
    fit_src = inspect.getsource(TorchTrainer.fit)
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    fit_src += inspect.getsource(DataParallelTrainer)
    need("failure_policy=" in fit_src, "_initialize_and_run_controller(failure_policy=...)")
    handler = getattr(TorchTrainer, "_register_sigint_handler", None)
    need(
        handler is not None
        and list(inspect.signature(handler).parameters) == ["self", "controller"],
        "TorchTrainer._register_sigint_handler(self, controller)",
    )
    from ray.train.v2._internal.execution.controller import TrainController

    need(callable(getattr(TrainController, "abort", None)), "TrainController.abort")
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    from ray.train.v2.api.exceptions import WorkerGroupError

    need(
        "worker_failures" in inspect.signature(WorkerGroupError.__init__).parameters,
        "WorkerGroupError(worker_failures=...)",
    )
    need(
        "_base_exc" in inspect.getsource(UserExceptionWithTraceback),
        "UserExceptionWithTraceback._base_exc",
    )
    if problems and ray.__version__ != RAY_PRIVATE_API_CHECKED_WITH:
        problems.append(
            f"(checked with Ray {RAY_PRIVATE_API_CHECKED_WITH}, installed {ray.__version__})"
        )
    return problems
