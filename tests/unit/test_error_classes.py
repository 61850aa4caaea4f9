"""Which failures a retry cannot fix: found wherever they were raised (driver, feeder actor,
worker) and however Ray wrapped them, so Ray Train raises them at the first failure and the CLI
prints their one line."""

from __future__ import annotations

import errno

import pytest

from jobs import train as train_cli
from pipeline.core.config import ConfigError
from pipeline.train.control import deterministic_cause, is_deterministic


def _decide(exc: BaseException) -> str:
    from ray.train import FailureConfig
    from ray.train.v2.api.exceptions import WorkerGroupError

    from pipeline.train.control import FatalUserErrorsPolicy

    policy = FatalUserErrorsPolicy(FailureConfig(max_failures=2))
    return policy.make_decision(WorkerGroupError("x", {0: RuntimeError("peer"), 1: exc})).value


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOSPC, "No space left on device", "/runs/x/checkpoint_step00000010"),
        OSError(errno.EROFS, "Read-only file system", "/data/_bucketray_index/rows"),
        PermissionError(errno.EACCES, "Permission denied", "/data/a.parquet"),
        FileNotFoundError(errno.ENOENT, "No such file or directory", "/cfg/config.json"),
        OSError("[pyarrow] IOError: No space left on device. Detail: [errno 28]"),  # no errno
    ],
    ids=["disk-full", "read-only", "permission", "missing-file", "pyarrow-text"],
)
def test_permanent_storage_errors_are_not_retried(exc):
    assert is_deterministic(exc)
    assert _decide(exc) == "RAISE"


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("a lost worker"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        OSError("AWS Error SLOW_DOWN during GetObject operation: 503 Slow Down"),
        TimeoutError("timed out"),
    ],
)
def test_transient_failures_are_still_retried(exc):
    assert not is_deterministic(exc)
    assert _decide(exc) == "RETRY"


def test_an_error_raised_in_the_feeder_is_found_inside_the_ray_task_error():
    from ray.exceptions import RayTaskError

    inner = OSError(errno.EROFS, "Read-only file system", "/shared/data/_bucketray_index/rows")
    try:
        raise inner
    except OSError as e:
        wrapped = RayTaskError("Feeder.part", "traceback text", e).as_instanceof_cause()
    assert _decide(wrapped) == "RAISE"
    assert deterministic_cause(wrapped) is inner


def test_a_user_error_raised_from_another_is_found_through_its_cause():
    try:
        try:
            raise ValueError("model_type 'lama' is unknown")
        except ValueError as e:
            raise ConfigError("model.hf_config: cannot build the model") from e
    except ConfigError as e:
        err = RuntimeError("worker failed")
        err.__cause__ = e
    assert deterministic_cause(err).args[0].startswith("model.hf_config")


def test_a_worker_group_failure_with_a_full_disk_is_one_line_exit_2(monkeypatch, capsys):
    from ray.train.v2.api.exceptions import WorkerGroupError

    import pipeline.train.launch as launch

    full = OSError(errno.ENOSPC, "No space left on device", "/runs/r/checkpoint_step00000010")

    def run(cfg, *, address=None, debug=False):
        raise WorkerGroupError("training failed", {0: full})

    monkeypatch.setattr(launch, "run", run)
    assert train_cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "checkpoint_step" in err


def test_a_worker_group_start_failing_on_read_only_storage_is_not_retried():
    from ray.train import FailureConfig
    from ray.train.v2._internal.exceptions import WorkerGroupStartupFailedError
    from ray.train.v2.api.exceptions import ControllerError

    from pipeline.train.control import FatalUserErrorsPolicy

    def start_failed(cause: BaseException) -> ControllerError:
        try:
            raise WorkerGroupStartupFailedError("worker group failed to start") from cause
        except WorkerGroupStartupFailedError as e:
            return ControllerError(e)

    erofs = OSError(errno.EROFS, "Read-only file system", "/runs/r")
    policy = FatalUserErrorsPolicy(FailureConfig(max_failures=2, controller_failure_limit=3))
    assert policy.make_decision(start_failed(erofs)).value == "RAISE"
    assert deterministic_cause(start_failed(erofs)) is erofs  # the CLI's one line
    # a start-up that failed for a reason a retry may fix still counts scaling.start_retries
    assert policy.make_decision(start_failed(TimeoutError("node died"))).value == "RETRY"
