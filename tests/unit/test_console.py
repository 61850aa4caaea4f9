"""What a run prints: the driver shows workers' run lines only, and the Ray internals that this
relies on are pinned here, so a Ray upgrade that moves them fails with a clear message."""

from __future__ import annotations

import inspect
import logging

import pytest

from pipeline.train.console import (
    RUN_PREFIX,
    is_run_line,
    quiet_driver_logging,
    show_run_lines_only,
)


def test_run_lines_are_ours_only():
    assert is_run_line("[bucketray] step 10/113 | loss 3.5")
    assert is_run_line("bucketray: writing the corpus")
    assert not is_run_line("Checkpoint successfully created at: Checkpoint(...)")
    assert not is_run_line("wandb: Run data is saved locally in ...")
    assert not is_run_line("[2026-12-02 E 7952] core_worker.cc:2465: Actor ...")


def test_ray_internals_the_console_filter_relies_on_are_where_it_expects():
    hint = "Ray moved its worker-log dispatcher: update pipeline/train/console.py"
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as d
        from ray._private.worker import print_to_stdstream
    except ImportError as e:  # pragma: no cover - only on a Ray upgrade
        pytest.fail(f"{hint} ({e})")
    assert callable(d.add_handler) and callable(d.remove_handler) and callable(d.emit), hint
    assert "ignore_prefix" in inspect.signature(print_to_stdstream).parameters, hint


def test_forwarded_worker_output_shows_only_run_lines(capsys):
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as d

    saved = list(d.handlers)
    try:
        show_run_lines_only()
        assert [name for name, _ in d.handlers].count("ray_print_logs") == 1
        d.emit(
            {
                "ip": "127.0.0.1",
                "pid": 4242,
                "job": "01000000",
                "is_err": False,
                "actor_name": "",
                "task_name": "",
                "lines": [
                    "Checkpoint successfully created at: Checkpoint(...)",
                    f"{RUN_PREFIX} step 10/20 | loss 3.41",
                    "wandb: Tracking run with wandb version 0.31.0",
                ],
            }
        )
    finally:
        d.handlers = saved
    out = capsys.readouterr().out
    assert f"{RUN_PREFIX} step 10/20 | loss 3.41" in out
    assert "Checkpoint successfully" not in out and "wandb" not in out


def test_token_auth_notice_is_dropped_but_other_warnings_stay(caplog):
    assert quiet_driver_logging(debug=False) == logging.WARNING
    assert quiet_driver_logging(debug=True) == logging.INFO
    log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    # Caught on the logger itself: once Ray has configured its logging in this process (an
    # earlier test's session), the "ray" logger no longer propagates to the root's handler.
    propagate, log.propagate = log.propagate, False
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger=log.name):
            log.warning("Token authentication is enabled for this Ray cluster.")
            log.warning("something else")
    finally:
        log.removeHandler(caplog.handler)
        log.propagate = propagate
    assert [r.getMessage() for r in caplog.records] == ["something else"]
