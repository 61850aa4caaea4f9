"""The run directory's lease (one run at a time per run name) and the graceful-stop request,
on a local pyarrow filesystem."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pyarrow.fs as pafs
import pytest

from pipeline.train.runlock import (
    LEASE_FILE,
    Lease,
    RunInUseError,
    RunLease,
    lease_decision,
    make_stop_handler,
)

FS = pafs.LocalFileSystem()
NOW = 1_000_000.0


def _lease(path, **kw):
    return RunLease(FS, str(path), settle_s=0.0, heartbeat_s=0.05, **kw)


# --------------------------------------------------------------------------- the rule


def test_a_fresh_lease_of_a_live_holder_is_refused():
    held = Lease("other", "hostA", 123, NOW - 5)
    why = lease_decision(held, now=NOW, host="hostA", alive=lambda pid: True)
    assert why == "held by pid 123 on hostA, heartbeat 5 s ago"
    # on another host the pid cannot be checked: freshness decides
    assert lease_decision(held, now=NOW, host="hostB", alive=lambda pid: False) is not None


def test_a_stale_lease_or_a_dead_holder_on_this_host_is_taken_over():
    assert lease_decision(None, now=NOW, host="h") is None
    stale = Lease("other", "hostB", 123, NOW - 500)
    assert lease_decision(stale, now=NOW, host="hostA", stale_s=120) is None
    dead = Lease("other", "hostA", 123, NOW - 1)
    assert lease_decision(dead, now=NOW, host="hostA", alive=lambda pid: False) is None


# --------------------------------------------------------------------------- the I/O


def test_second_run_is_refused_while_the_first_holds_it_and_may_go_after(tmp_path):
    run = tmp_path / "runs" / "same-name"
    with _lease(run) as first:
        held = json.loads((run / LEASE_FILE).read_text())
        assert held["holder"] == first.holder and held["pid"] == os.getpid()
        with pytest.raises(RunInUseError) as e:
            _lease(run).acquire()
        msg = str(e.value)
        assert "\n" not in msg and str(run) in msg and "checkpoint.run_name" in msg
    assert not (run / LEASE_FILE).exists()  # released on exit
    with _lease(run):
        pass


def test_the_lease_is_released_when_the_run_fails(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with _lease(tmp_path):
            raise RuntimeError("boom")
    assert not (tmp_path / LEASE_FILE).exists()


def test_heartbeat_keeps_the_lease_fresh(tmp_path):
    import time

    with _lease(tmp_path):  # beating every 0.05 s; read while it writes (renamed into place)
        t0 = json.loads((tmp_path / LEASE_FILE).read_text())["heartbeat"]
        deadline = time.monotonic() + 10
        beats = t0
        while beats == t0 and time.monotonic() < deadline:
            time.sleep(0.01)
            beats = json.loads((tmp_path / LEASE_FILE).read_text())["heartbeat"]
        assert beats > t0


def test_a_lease_left_by_a_dead_process_is_taken_over(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone = Lease("crashed", socket.gethostname(), int(proc.stdout), NOW)  # fresh heartbeat
    (tmp_path / LEASE_FILE).write_text(gone.to_json())
    with _lease(tmp_path) as lease:
        assert json.loads((tmp_path / LEASE_FILE).read_text())["holder"] == lease.holder


def test_a_lease_from_another_host_is_watched_then_taken_over_if_its_heartbeat_stops(tmp_path):
    import time

    silent = Lease("replaced-pod", "elsewhere", 1, time.time())
    (tmp_path / LEASE_FILE).write_text(silent.to_json())
    with _lease(tmp_path, stale_s=0.5) as lease:
        assert json.loads((tmp_path / LEASE_FILE).read_text())["holder"] == lease.holder


def test_a_lease_from_another_host_whose_heartbeat_moves_is_refused(tmp_path):
    import threading
    import time

    def beat():
        for _ in range(20):
            (tmp_path / LEASE_FILE).write_text(Lease("live", "elsewhere", 1, time.time()).to_json())
            time.sleep(0.05)

    (tmp_path / LEASE_FILE).write_text(Lease("live", "elsewhere", 1, time.time()).to_json())
    t = threading.Thread(target=beat)
    t.start()
    try:
        with pytest.raises(RunInUseError, match="alive"):
            _lease(tmp_path, stale_s=30).acquire()
    finally:
        t.join()


def test_a_stale_lease_is_taken_over(tmp_path):
    old = Lease("old", "elsewhere", 1, 0.0)
    (tmp_path / LEASE_FILE).write_text(old.to_json())
    with _lease(tmp_path, stale_s=60):
        pass


def test_releasing_never_deletes_another_holders_lease(tmp_path):
    lease = _lease(tmp_path).acquire()
    other = Lease("other", "elsewhere", 1, NOW)
    lease._stop.set()  # no heartbeat overwriting the takeover below
    (tmp_path / LEASE_FILE).write_text(other.to_json())
    lease.release()
    assert json.loads((tmp_path / LEASE_FILE).read_text())["holder"] == "other"


# --------------------------------------------------------------------------- signals


def test_first_signal_requests_a_stop_the_second_aborts(tmp_path, capsys):
    calls, requests = [], []
    handler = make_stop_handler(lambda: requests.append(1), lambda: calls.append(1))
    handler(signal.SIGTERM, None)
    assert requests == [1] and calls == []
    assert "SIGTERM: stopping after the current step" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ended:
        handler(signal.SIGTERM, None)
    assert calls == [1] and requests == [1] and ended.value.code == 130
    # the second signal ends the driver with a closing line, not silently
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith("[bucketray] aborted by a second SIGTERM")
    )
    with pytest.raises(SystemExit):
        handler(signal.SIGINT, None)
