"""A local filesystem whose first N opens of chosen files fail, counted in a file on disk so the
count holds across the driver and Ray worker processes (test helper, not a test module)."""

from __future__ import annotations

import fcntl
import os

import pyarrow.fs as pafs


class FlakyHandler(pafs.FileSystemHandler):
    """Delegates to LocalFileSystem; opening a file whose name is in `fail_names` raises
    `error(message)` until `fail_times` failures are recorded in `counter_path`."""

    def __init__(self, counter_path, fail_names, fail_times, error=OSError, message=""):
        self.counter_path = str(counter_path)
        self.fail_names = tuple(fail_names)
        self.fail_times = fail_times
        self.error = error
        self.message = message
        self.local = pafs.LocalFileSystem()

    def _maybe_fail(self, path: str) -> None:
        if os.path.basename(path) not in self.fail_names:
            return
        with open(self.counter_path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            failed = len(f.read().splitlines())
            if failed < self.fail_times:
                f.write(f"{os.getpid()} {path}\n")
                f.flush()
                raise self.error(self.message)

    def open_input_file(self, path):
        self._maybe_fail(path)
        return self.local.open_input_file(path)

    def open_input_stream(self, path):
        self._maybe_fail(path)
        return self.local.open_input_stream(path)

    def get_type_name(self):
        return "flaky"

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("not supported")

    def delete_file(self, path):
        self.local.delete_file(path)

    def move(self, src, dest):
        self.local.move(src, dest)

    def copy_file(self, src, dest):
        self.local.copy_file(src, dest)

    def open_output_stream(self, path, metadata):
        return self.local.open_output_stream(path)

    def open_append_stream(self, path, metadata):
        return self.local.open_append_stream(path)


def failures(counter_path) -> int:
    """How many opens failed so far."""
    return len(open(counter_path).read().splitlines()) if os.path.exists(counter_path) else 0
