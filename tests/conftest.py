"""Settings for every test session.

W&B's own analytics (OpenTelemetry exporters posting to the W&B server) start in any process
that logs a run, a disabled or offline one included; their exit hook exports from threads while
the interpreter shuts down, which fails with "cannot schedule new futures after interpreter
shutdown" and prints a traceback after the summary, as if the suite had broken. A test session
sends no analytics (the variable reaches Ray's processes and the jobs the tests start), and
tears W&B down while threads still run.

Ray Data's usage collection does the same from a daemon thread of every process that runs a
dataset: it polls Prometheus (none runs here) and logs each failure with its traceback, also
while the interpreter shuts down, when the log file is closed ("--- Logging error ---" after
the summary). A test session collects no Ray Data usage either.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
os.environ.setdefault("RAY_DATA_USAGE_DISABLED", "1")


@pytest.fixture(scope="session", autouse=True)
def _wandb_torn_down_before_exit():
    yield
    if "wandb" in sys.modules:
        import wandb

        wandb.teardown()
