"""What a run prints: its own lines, not Ray's start-up, progress blocks and worker chatter.

By default the driver's console shows the lines this project writes (they start with
`[bucketray]`; warnings raised on the workers, the feeder and the index tasks come through the
run's warning collector, once each: `pipeline.data.run_warnings`) and Ray's warnings and errors
from the driver itself. Everything else -- Ray's start-up banner, Ray Data's
progress blocks, Ray Train's controller and worker messages, W&B's banners -- still goes to Ray's
session logs (`/tmp/ray/session_latest/logs` on the head: `worker-*.out`, `ray-data.log`), and
`--debug` prints it on the console as Ray would.

Ray offers no public switch for "show these workers' lines only", so `show_run_lines_only`
swaps the driver's handler of forwarded worker output (`ray._private`); this module is the only
place that does, and `tests/unit/test_console.py` pins the names it relies on.
"""

from __future__ import annotations

import functools
import logging

from pipeline.data.run_warnings import RUN_PREFIX

__all__ = [
    "RUN_PREFIX",
    "WORKER_ENV",
    "is_run_line",
    "quiet_driver_logging",
    "show_run_lines_only",
]

# Train V2 patches `print` on its workers to tee into the root logger; with W&B wrapping stdout,
# every line then reached the console twice. Our lines are plain prints, so the patch is off.
WORKER_ENV = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}


def is_run_line(line: str) -> bool:
    """A line of this project's (shown on the driver's console by default)."""
    text = line.lstrip()
    return text.startswith(RUN_PREFIX) or text.startswith("bucketray:")


class _DropMessage(logging.Filter):
    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(f in msg for f in self.fragments)


def quiet_driver_logging(debug: bool) -> int:
    """Before `ray.init`: Ray's INFO lines stay in its logs; returns the level for `ray.init`."""
    if debug:
        return logging.INFO
    # Ray 2.60 warns at every start that token authentication is on. It is on by design here
    # (the job server needs it), so the warning says nothing a user must act on.
    for name in ("ray._private.authentication.authentication_token_setup", "ray"):
        logging.getLogger(name).addFilter(_DropMessage("Token authentication is enabled"))
    return logging.WARNING


def quiet_ray_data(debug: bool) -> None:
    """Ray Data's INFO lines (execution plans, progress blocks) go to `ray-data.log` only."""
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = debug
    if debug:
        return
    for handler in logging.getLogger("ray.data").handlers:
        if not hasattr(handler, "baseFilename"):  # the console handler; the file keeps INFO
            handler.setLevel(logging.WARNING)
            # Said once per run because we turned the bars off on purpose.
            handler.addFilter(_DropMessage("Progress bars disabled"))


def show_run_lines_only() -> None:
    """After `ray.init`: forward only workers' run lines (and tracebacks of our own processes'
    errors are still raised on the driver by Ray Train); the rest stays in the session logs."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher
    from ray._private.worker import print_to_stdstream

    show = functools.partial(print_to_stdstream, ignore_prefix=True)

    def handler(data: dict) -> None:
        lines = [ln for ln in data.get("lines", ()) if is_run_line(ln)]
        if lines:
            show({**data, "lines": lines})

    global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")
    global_worker_stdstream_dispatcher.add_handler("ray_print_logs", handler)
