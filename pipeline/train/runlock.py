"""The run lease (one run at a time per run directory) and the driver's signal handler.

Lease: `<storage>/<run_name>/RUN_LEASE.json`.

Two drivers training the same `checkpoint.run_name` into the same storage would write into the
same checkpoint folders, and one's `keep_last` would delete the other's checkpoints. The lease
names its holder (a random id, host, pid) and a heartbeat time the holder refreshes every
HEARTBEAT_S seconds. A second run on the holder's host refuses while the holder process lives;
a lease whose heartbeat is older than STALE_S, or whose holder process is gone on this host, is
taken over. A lease from another host (say a head pod that was replaced) is watched for up to
STALE_S: taken over if its heartbeat does not move, refused if it does. The holder deletes it on
exit, error included.

Written through a pyarrow filesystem, so it works on s3:// too. Object stores have no
compare-and-swap: after writing, the driver waits a moment and reads the lease back, so two
drivers starting within the same second do not both go ahead (the later write wins).
`lease_decision` is the pure rule; `RunLease` does the I/O.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import pyarrow.fs as pafs

from pipeline.core.config import ConfigError

__all__ = ["LEASE_FILE", "STALE_S", "HEARTBEAT_S", "Lease", "RunInUseError"]
__all__ += ["RunLease", "lease_decision", "make_stop_handler", "pid_alive", "signals_interrupt"]
__all__ += ["ABORT_EXIT", "interrupted_line"]

LEASE_FILE = "RUN_LEASE.json"
STALE_S = 120.0  # a heartbeat older than this: the holder is gone
HEARTBEAT_S = 20.0
SETTLE_S = 1.0  # wait before reading a freshly written lease back

log = logging.getLogger(__name__)


class RunInUseError(ConfigError):
    """Another live run holds this run directory's lease."""


@dataclass(frozen=True)
class Lease:
    holder: str
    host: str
    pid: int
    heartbeat: float  # unix time of the holder's last refresh

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Lease | None:
        try:
            d = json.loads(text)
            return cls(str(d["holder"]), str(d["host"]), int(d["pid"]), float(d["heartbeat"]))
        except (ValueError, KeyError, TypeError):
            return None  # unreadable (e.g. half-written): treated as no lease


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, someone else's
    return True


def lease_decision(
    existing: Lease | None,
    *,
    now: float,
    host: str,
    stale_s: float = STALE_S,
    alive: Callable[[int], bool] = pid_alive,
) -> str | None:
    """None if the lease may be taken, else why not (the holder, and how fresh it is)."""
    if existing is None:
        return None
    age = now - existing.heartbeat
    if age > stale_s:
        return None
    if existing.host == host and not alive(existing.pid):
        return None
    return f"held by pid {existing.pid} on {existing.host}, heartbeat {max(age, 0):.0f} s ago"


class RunLease:
    """Context manager: take the lease of `run_dir` on `fs`, refresh it, release it on exit."""

    def __init__(self, fs: pafs.FileSystem, run_dir: str, *, stale_s: float = STALE_S,
                 heartbeat_s: float = HEARTBEAT_S, settle_s: float = SETTLE_S):  # fmt: skip
        self.fs, self.run_dir = fs, run_dir.rstrip("/")
        self.path = f"{self.run_dir}/{LEASE_FILE}"
        self.stale_s, self.heartbeat_s, self.settle_s = stale_s, heartbeat_s, settle_s
        self.holder = uuid.uuid4().hex
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> Lease | None:
        for _ in range(3):  # a lease caught mid-write on a local disk reads as garbage
            try:
                with self.fs.open_input_stream(self.path) as f:
                    lease = Lease.from_json(f.read().decode())
            except FileNotFoundError:
                return None
            if lease is not None:
                return lease
            time.sleep(0.1)
        return None

    def _write(self) -> None:
        data = Lease(self.holder, self.host, self.pid, time.time()).to_json().encode()
        if isinstance(self.fs, pafs.LocalFileSystem):
            # Written aside, then renamed over the lease: a reader sees the old lease or the new
            # one, never a file caught mid-write. (An object store replaces an object whole.)
            tmp = f"{self.path}.tmp-{self.pid}"
            with self.fs.open_output_stream(tmp) as f:
                f.write(data)
            self.fs.move(tmp, self.path)
            return
        with self.fs.open_output_stream(self.path) as f:
            f.write(data)

    def _refuse(self, why: str) -> RunInUseError:
        return RunInUseError(
            f"run directory {self.run_dir} is in use ({self.path} {why}): wait for that run to "
            "end, choose another checkpoint.run_name, or delete the lease file if that run is "
            f"gone (a lease not refreshed for {self.stale_s:.0f} s is taken over)"
        )

    def _decide(self, lease: Lease | None) -> str | None:
        return lease_decision(lease, now=time.time(), host=self.host, stale_s=self.stale_s)

    def _wait_out(self, held: Lease) -> str | None:
        """A lease from another host (whose pid cannot be checked, e.g. a replaced head pod):
        watch it until it goes stale (None: take it over) or its heartbeat moves (alive)."""
        log.warning(
            "run lease %s is held from %s: waiting up to %.0f s to see whether that run is alive",
            self.path, held.host, self.stale_s,
        )  # fmt: skip
        while True:
            time.sleep(min(self.heartbeat_s, 5.0))
            cur = self._read()
            if cur is None or cur.holder != held.holder:
                return self._decide(cur)
            if cur.heartbeat != held.heartbeat:
                return f"held by pid {cur.pid} on {cur.host}, which is alive (heartbeat moved)"
            if self._decide(cur) is None:
                return None

    def acquire(self) -> RunLease:
        held = self._read()
        why = self._decide(held)
        if why is not None and held is not None and held.host != self.host:
            why = self._wait_out(held)
        if why is not None:
            raise self._refuse(why)
        self.fs.create_dir(self.run_dir, recursive=True)
        self._write()
        time.sleep(self.settle_s)
        got = self._read()
        if got is None or got.holder != self.holder:
            raise self._refuse("was taken by another run starting at the same time")
        self._thread = threading.Thread(target=self._beat, name="run-lease", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                got = self._read()
                if got is not None and got.holder != self.holder:
                    log.warning("run lease %s was taken over by pid %s", self.path, got.pid)
                    return
                self._write()
            except OSError as e:  # a storage hiccup: try again at the next beat
                log.warning("could not refresh the run lease %s: %s", self.path, e)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            got = self._read()
            if got is not None and got.holder == self.holder:
                self.fs.delete_file(self.path)
        except OSError as e:
            log.warning("could not release the run lease %s: %s", self.path, e)

    def __enter__(self) -> RunLease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# --------------------------------------------------------------------------- signals
# (SIGINT / SIGTERM during fit(): the first asks the workers to stop with a checkpoint through
# the run's stop flag, pipeline/train/stop.py; the second aborts; the third exits.)


# The shell's exit status for a run ended by SIGINT (128 + 2), used for either signal.
ABORT_EXIT = 130


def interrupted_line(name: str, *, training: bool) -> str:
    """The closing line of a run ended by signal `name` (without a graceful stop)."""
    if training:
        return (
            f"[bucketray] aborted by a second {name}: the steps since the last checkpoint are not "
            "saved; resubmit the same command to resume from that checkpoint"
        )
    return (
        f"[bucketray] interrupted by {name} before training started: nothing was trained or "
        "checkpointed by this run; run the same command again to start it"
    )


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """While the driver prepares the run (index, edges, plans): SIGINT and SIGTERM raise
    KeyboardInterrupt, so the lease and the Ray instance are released by their `finally`
    blocks and the CLI prints one closing line, instead of the process dying silently
    (SIGTERM's default) with its lease still held. SIGINT is set too, not left to Python's
    default: a handler installed earlier in the process (by Ray, or an embedding program) would
    otherwise swallow a Ctrl-C here. The handlers found are restored on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    before = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def make_stop_handler(request: Callable[[], object], abort: Callable[[], object]):
    """A signal handler: the first signal calls `request` (graceful stop), the second `abort`
    and ends the driver with a closing line, the third exits at once."""
    count = 0

    def handler(signum, frame) -> None:
        nonlocal count
        count += 1
        name = signal.Signals(signum).name
        if count == 1:
            print(
                f"[bucketray] {name}: stopping after the current step with a checkpoint "
                "(send it again to abort without one)",
                file=sys.stderr,
                flush=True,
            )
            request()
        elif count == 2:
            print(f"[bucketray] {name} again: aborting the run", file=sys.stderr, flush=True)
            abort()
            print(interrupted_line(name, training=True), file=sys.stderr, flush=True)
            sys.exit(ABORT_EXIT)
        else:
            sys.exit(130)

    return handler
