"""Memory probes of the delivery benchmarks: the object store's bytes in use and processes' RSS,
polled in a thread while an epoch runs."""

from __future__ import annotations

import threading
import time

__all__ = ["RssPeak", "StorePeak"]


class StorePeak:
    """Polls the object store's bytes in use (all nodes) in a thread; `peak` above the start.

    Reads the raylets' store stats through `ray._private.internal_api`, the call behind
    `ray memory --stats-only`: Ray has no public API for bytes in use. Kept to this benchmark.
    """

    def __init__(self, every_s: float = 0.25):
        import threading

        import ray
        from ray._private.internal_api import get_state_from_address

        self._state = get_state_from_address(ray.get_runtime_context().gcs_address)
        self.every_s, self.peak, self.spilled = every_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _stats(self):
        from ray._private.internal_api import get_memory_info_reply

        return get_memory_info_reply(self._state).store_stats

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            st = self._stats()
            self.peak = max(self.peak, int(st.object_store_bytes_used) - self.base)
            self.spilled = int(st.spilled_bytes_total) - self.base_spilled

    def __enter__(self):
        # Objects of an earlier run are freed asynchronously: wait for the level to settle.
        last, steady = -1, 0
        for _ in range(120):
            used = int(self._stats().object_store_bytes_used)
            steady = steady + 1 if used == last else 0
            if steady >= 4:
                break
            last = used
            time.sleep(self.every_s)
        st = self._stats()
        self.base, self.base_spilled = int(st.object_store_bytes_used), int(st.spilled_bytes_total)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _rss(pid: int) -> tuple[int, int]:
    """(resident bytes, of which private: RssAnon) of process `pid` (Linux /proc); zeros once
    it has ended. The rest is shared: the object store's pages it touched, files it mapped."""
    got = {"VmRSS:": 0, "RssAnon:": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k = line.split(maxsplit=1)[0] if line.strip() else ""
                if k in got:
                    got[k] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return got["VmRSS:"], got["RssAnon:"]


class RssPeak:
    """Polls the peak RSS of some processes (by pid) in a thread; `anon` holds the peaks of
    their private memory."""

    def __init__(self, pids: list[int], every_s: float = 0.25):
        self.pids, self.peak, self.anon = pids, [0] * len(pids), [0] * len(pids)
        self.every_s, self._stop = every_s, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            for i, pid in enumerate(self.pids):
                rss, anon = _rss(pid)
                self.peak[i], self.anon[i] = max(self.peak[i], rss), max(self.anon[i], anon)
            if self._stop.wait(self.every_s):
                return

    def close(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return self.peak
