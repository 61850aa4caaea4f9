"""Settings for every test session.

W&B's own analytics (OpenTelemetry exporters posting to the W&B server) start in any process
that logs a run, a disabled or offline one included; their exit hook exports from threads while
the interpreter shuts down, which fails with "cannot schedule new futures after interpreter
shutdown" and prints a traceback after the summary, as if the suite had broken. A test session
sends no analytics (the variable reaches Ray's processes and the jobs the tests start), and
tears W&B down while threads still run.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("WANDB_ERROR_REPORTING", "false")


@pytest.fixture(scope="session", autouse=True)
def _wandb_torn_down_before_exit():
    yield
    if "wandb" in sys.modules:
        import wandb

        wandb.teardown()
