"""Memory probes of the delivery benchmarks: the object store's bytes in use (all nodes, or
per node) and processes' RSS, polled in a thread while an epoch runs; and where a rank's blocks
are stored when it is handed them."""

from __future__ import annotations

import threading
import time

__all__ = ["INLINE", "NodeStorePeaks", "PartLocations", "RssPeak", "StorePeak", "node_bytes"]

INLINE = "inline"  # a block with no node: small, in its owner's (the feeder's) memory


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


class NodeStorePeaks:
    """Polls every node's object store in a thread, each through its own raylet (`GetNodeStats`,
    the per-node call behind `ray memory`; `StorePeak` reads the cluster's sum): per node id, its
    bytes in use as the block starts (`base`), the peaks (absolute, not above `base`) of the bytes
    in use (secondary copies included: evictable) and in primary copies, the spilled bytes added,
    and the store's capacity. A node whose raylet does not answer keeps its last figures.
    Private Ray API (`ray._private.internal_api.node_stats`), kept to the benchmarks."""

    def __init__(self, every_s: float = 0.5):
        import ray

        alive = [n for n in ray.nodes() if n["Alive"]]
        self.raylets = {n["NodeID"]: (n["NodeManagerAddress"], n["NodeManagerPort"]) for n in alive}
        self.every_s, self._stop = every_s, threading.Event()
        self.nodes: dict[str, dict] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _stats(self, node_id: str):
        from ray._private.internal_api import node_stats

        addr, port = self.raylets[node_id]
        return node_stats(addr, port, include_memory_info=False).store_stats

    def _poll(self) -> None:
        for node_id in self.raylets:
            try:
                st = self._stats(node_id)
            except Exception:  # a node going away, a slow raylet: keep what was seen
                continue
            d = self.nodes.setdefault(
                node_id,
                {
                    "base": int(st.object_store_bytes_used),
                    "base_spilled": int(st.spilled_bytes_total),
                    "peak": 0,
                    "peak_primary": 0,
                },
            )
            d["peak"] = max(d["peak"], int(st.object_store_bytes_used))
            d["peak_primary"] = max(d["peak_primary"], int(st.object_store_bytes_primary_copy))
            d["spilled"] = int(st.spilled_bytes_total) - d["base_spilled"]
            d["capacity"] = int(st.object_store_bytes_avail)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._poll()

    def __enter__(self):
        self._poll()  # the levels before the block
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._poll()


class PartLocations:
    """In a rank's process: as its stream accepts each part from the feeder (`RankPart.check`,
    wrapped in this process only; delivery is unchanged), before any of its blocks is fetched,
    records each block's size and the ids of the nodes holding it (`get_object_locations`,
    asked of the blocks' owner) in `blocks`, and the seconds that took in `seconds`."""

    def __init__(self):
        from ray.experimental import get_object_locations

        from pipeline.data.protocol import RankPart

        self.blocks: list[tuple[int, list[str]]] = []
        self.seconds = 0.0
        check = RankPart.check

        def watched(part, **kw):
            check(part, **kw)
            t = time.perf_counter()
            refs = list(part.refs)
            locs = get_object_locations(refs) if refs else {}
            for ref in refs:
                loc = locs.get(ref) or {}
                self.blocks.append(
                    (int(loc.get("object_size") or 0), list(loc.get("node_ids") or []))
                )
            self.seconds += time.perf_counter() - t

        RankPart.check = watched


def node_bytes(blocks, rank_node: list[str], nodes: list[str], placed=None) -> dict:
    """Bytes per node of the blocks the ranks were handed: `blocks` holds (rank, bytes, the
    nodes holding the block when handed); rank r runs on node `rank_node[r]`. A block comes from
    its rank's node when that node holds it, else from the first node holding it, which sends
    it (none: inline from its owner, INLINE). Per node: `stored` (bytes of the blocks it held),
    `sent` (to ranks on other nodes), `own` (what its ranks got), `own_share` (of all bytes),
    `sent_per_own` (sent / own; None without ranks); per rank: its bytes, those on its node.
    `placed` ({node: bytes}): what each node sent copying blocks to their rank's node before
    they were handed (`pipeline.data.prepare.place_blocks`), counted as sent too."""
    stored, sent, own = dict.fromkeys(nodes, 0), dict.fromkeys(nodes, 0), dict.fromkeys(nodes, 0)
    got, local = [0] * len(rank_node), [0] * len(rank_node)
    for rank, size, where in blocks:
        me = rank_node[rank]
        for n in set(where):
            stored[n] = stored.get(n, 0) + size
        own[me] = own.get(me, 0) + size
        got[rank] += size
        if me in where:
            local[rank] += size
        else:
            src = where[0] if where else INLINE
            sent[src] = sent.get(src, 0) + size
    for n, size in (placed or {}).items():
        sent[n] = sent.get(n, 0) + size
    total = sum(got)
    per_node = {}
    for n in [*nodes, *sorted(set(sent) - set(nodes))]:
        o = own.get(n, 0)
        per_node[n] = {"stored": stored.get(n, 0), "sent": sent.get(n, 0), "own": o}
        per_node[n] |= {"own_share": o / total if total else 0.0}
        per_node[n] |= {"sent_per_own": sent.get(n, 0) / o if o else None}
    ratios = [v["sent_per_own"] for v in per_node.values() if v["sent_per_own"] is not None]
    ranks = [
        {"bytes": g, "local_bytes": loc, "local_share": loc / g if g else None}
        for g, loc in zip(got, local, strict=True)
    ]
    shares = [r["local_share"] for r in ranks if r["local_share"] is not None]
    return {
        "total_bytes": total,
        "nodes": per_node,
        "ranks": ranks,
        "max_sent_per_own": max(ratios) if ratios else None,
        "min_local_share": min(shares) if shares else None,
    }
