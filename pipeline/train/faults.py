"""Fault injection for tests, driven by the environment and inert unless set.

`maybe_fail(steps_done, rank)` raises right after global step N has been trained (and
checkpointed if due), once per rank: the marker file `<BUCKETRAY_FAIL_MARKER>.rank<r>` makes it
happen once across restarts. `BUCKETRAY_FAIL_RANK` limits it to one rank (the others then wait in
the next collective). The driver forwards these variables to the workers (launch.FORWARDED_ENV).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["FAIL_AT_STEP_ENV", "FAIL_MARKER_ENV", "FAIL_RANK_ENV", "maybe_fail"]

FAIL_AT_STEP_ENV = "BUCKETRAY_FAIL_AT_STEP"
FAIL_MARKER_ENV = "BUCKETRAY_FAIL_MARKER"
FAIL_RANK_ENV = "BUCKETRAY_FAIL_RANK"


def maybe_fail(steps_done: int, rank: int) -> None:
    at = os.environ.get(FAIL_AT_STEP_ENV)
    marker = os.environ.get(FAIL_MARKER_ENV)
    if at is None or marker is None or steps_done != int(at):
        return
    if os.environ.get(FAIL_RANK_ENV, str(rank)) != str(rank):
        return
    mark = Path(f"{marker}.rank{rank}")
    if mark.exists():
        return
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()
    raise RuntimeError(f"injected failure after global step {steps_done} ({FAIL_AT_STEP_ENV})")
