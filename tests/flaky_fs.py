"""A local pyarrow filesystem whose opens of one file fail for a while, as throttled storage does.

Opens of files ending in `target` are counted in `counter_file` (on disk, under a lock: the
filesystem is pickled into the feeder and into Ray Data read tasks in other processes); opens
number `fail_from` ... `fail_from + fail_count - 1` (0-based) raise `error(message)`, until
`heal()` is called. Shared by the unit tests of the read task and the Ray tests of the feeder.
"""

from __future__ import annotations

import fcntl
import os

import pyarrow.fs as pafs

SLOW_DOWN = "AWS Error SLOW_DOWN during GetObject operation: 503 Slow Down"


class FlakyHandler(pafs.FileSystemHandler):
    def __init__(
        self,
        target: str,
        counter_file: str,
        fail_count: int,
        fail_from: int = 0,
        message: str = SLOW_DOWN,
        error: type[OSError] = OSError,
    ):
        self.target, self.counter_file = target, str(counter_file)
        self.fail_from, self.fail_count = fail_from, fail_count
        self.message, self.error = message, error
        self.local = pafs.LocalFileSystem()

    def opens(self) -> int:
        """Opens of the target counted so far."""
        try:
            with open(self.counter_file) as f:
                return int(f.read() or 0)
        except FileNotFoundError:
            return 0

    def heal(self) -> None:
        """From now on every open succeeds (a marker file: other processes see it too)."""
        open(self.counter_file + ".healed", "w").close()

    def _count(self) -> int:
        with open(self.counter_file, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            n = int(f.read() or 0)
            f.seek(0)
            f.truncate()
            f.write(str(n + 1))
            return n

    def open_input_file(self, path):
        if path.endswith(self.target):
            n = self._count()
            failing = self.fail_from <= n < self.fail_from + self.fail_count
            if failing and not os.path.exists(self.counter_file + ".healed"):
                raise self.error(self.message)
        return self.local.open_input_file(path)

    # The rest delegates to the local filesystem.
    def __eq__(self, other):
        return isinstance(other, FlakyHandler) and vars(self) == vars(other)

    def __ne__(self, other):
        return not self == other

    def get_type_name(self):
        return "flaky-local"

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
        raise NotImplementedError

    def delete_file(self, path):
        self.local.delete_file(path)

    def move(self, src, dest):
        self.local.move(src, dest)

    def copy_file(self, src, dest):
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.local.open_input_stream(path)

    def open_output_stream(self, path, metadata):
        return self.local.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.local.open_append_stream(path, metadata=metadata)


def flaky_fs(target: str, counter_file, fail_count: int, **kw) -> pafs.FileSystem:
    return pafs.PyFileSystem(FlakyHandler(target, counter_file, fail_count, **kw))


def opens(fs: pafs.FileSystem) -> int:
    return fs.handler.opens()
