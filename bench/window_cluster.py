"""Windowed delivery on a simulated cluster: rates, first steps, object store and bytes per node.

    python -m bench.window_cluster [--samples 902087,2000000] [--nodes 4] [--ranks-per-node 2]
        [--window-tokens N] [--windows-consumed 3] [--json benchmarks/window_cluster.json]

Per corpus size (seed902k preset, 32 shards as `jobs.make_data` writes it, written once under
--work), a fresh `ray.cluster_utils.Cluster`: a head with no CPU (driver, feeder) and --nodes
one-CPU worker nodes, each with its own object store and resource `node<i>`. Rank r, a zero-CPU
actor on node r // ranks-per-node, pulls its blocks through `rank_batches`, the ranks in step as
under DDP. Windowed (default `plan.window_tokens`: tokens / 16, at least two of the largest row
groups), the delivery section at its defaults for windows: no row cache (a window is one Ray
Data pass on the worker nodes) and no lead-in (--lead-in: the global plan's default lead-in,
2**22 tokens, read in the feeder on the head), prefetch on.

Measured: plan-ready time (index, edges, plan); a cold start (feeder start to each rank's first
micro-batch) consumed through --windows-consumed windows, and a resume (a new feeder, the ranks
half-way through the next window); the feeder's preparation rate (real tokens over its
preparations' seconds); each rank's rate outside waits; each node's object-store peak (its
raylet's stats) against the largest window's bytes; where each block a rank was handed was
stored then (`bench.probes.PartLocations`), so what each node sends to ranks elsewhere; the row
groups each window read against its own. The nodes share this machine's cores, memory and disk:
"sent" bytes cross between raylets' object stores, not a network.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bench.common import loadavg, machine_info, write_json
from bench.probes import INLINE, NodeStorePeaks, PartLocations, node_bytes
from pipeline.core.chapters import row_group_of
from pipeline.core.config import RunConfig
from pipeline.core.deliveryconfig import DEFAULT_LEAD_TOKENS
from pipeline.core.epochs import epoch_plan_for, epoch_windows, resolve_edges
from pipeline.core.synthetic import PRESETS
from pipeline.core.windows import MIN_ROW_GROUPS_PER_WINDOW
from pipeline.data import build_length_index, rank_batches, start_feeder, stop_feeder
from pipeline.data.corpus import write_corpus

__all__ = ["INLINE", "default_window_tokens", "measure_size", "node_bytes", "prep_rates"]
__all__ += ["rank_rate", "read_check", "render"]

FEEDER = "bucketray-bench-window-cluster"
WINDOWS_PER_EPOCH = 16
SHARDS = 32  # jobs.make_data's default
VOCAB = 512  # jobs.make_data's default
MIB = 2**20
HEAD_STORE_BYTES = 2**29  # the head's object store: the feeder's small objects, a lead-in's blocks


def default_window_tokens(rg_tokens, windows: int = WINDOWS_PER_EPOCH) -> int:
    """The corpus's real tokens / `windows`, rounded up, but at least the tokens of
    MIN_ROW_GROUPS_PER_WINDOW of its largest row groups (a smaller window is refused)."""
    t = np.asarray(rg_tokens, dtype=np.int64)
    return max(-(-int(t.sum()) // windows), MIN_ROW_GROUPS_PER_WINDOW * int(t.max()))


def rank_rate(rec: dict, waits) -> dict:
    """A rank's rate outside waits: real tokens over the seconds its stream took to yield the
    micro-batches of steps not in `waits` (the first step of each range, which waits for the
    feeder's part and its first block); the seconds spent in the waiting ones, and their share
    of the rank's run. `rec`: each micro-batch's "steps", "real" tokens and "secs", and when the
    run "began" and "end"ed."""
    wall = rec["end"] - rec["began"]
    waiting = np.isin(np.asarray(rec["steps"], np.int64), np.asarray(sorted(waits), np.int64))
    secs, real = np.asarray(rec["secs"], np.float64), np.asarray(rec["real"], np.float64)
    busy = float(secs[~waiting].sum())
    return {
        "tokens_per_s": float(real[~waiting].sum()) / busy if busy > 0 else None,
        "busy_s": busy,
        "wait_s": float(secs[waiting].sum()),
        "wait_share": float(secs[waiting].sum()) / wall if wall > 0 else None,
    }


def prep_rates(hist: list[dict]) -> dict:
    """Preparation rates from the feeder's per-range records (ordered by start step): real
    tokens over plan + sort + split seconds, of the first range and of all."""
    secs = [h["plan_s"] + h["sort_s"] + h["split_s"] for h in hist]
    tokens = [h["tokens"] for h in hist]
    rate = lambda t, s: t / s if s > 0 else None  # noqa: E731
    return {
        "first_tokens_per_s": rate(sum(tokens[:1]), sum(secs[:1])),
        "sustained_tokens_per_s": rate(sum(tokens), sum(secs)),
        "ranges": len(hist),
        "prepare_s": secs,
    }


def read_check(hist: list[dict], window_rgs: list[int]) -> dict:
    """Row groups read per window, its ranges' together (a lead-in cuts a window in several),
    against its own (`window_rgs[w]`); `hist`: the records of every range of some windows
    (`chapter`: the window). Each row group of those windows is read exactly once iff each
    read exactly its own (with every window prepared: the whole epoch)."""
    by_window: dict[int, int] = {}
    for h in hist:
        by_window[h["chapter"]] = by_window.get(h["chapter"], 0) + int(h["row_groups_read"])
    windows = sorted(by_window)
    read, want = [by_window[w] for w in windows], [int(window_rgs[w]) for w in windows]
    return {
        "windows": windows,
        "row_groups_read": read,
        "row_groups_of_window": want,
        "read_per_row_group": sum(read) / sum(want) if sum(want) else None,
        "exactly_once": read == want,
        "whole_epoch": windows == list(range(len(window_rgs))),
    }


def _f(v, scale: float = 1.0, digits: int = 1, unit: str = "") -> str:
    return "not measured" if v is None else f"{v / scale:,.{digits}f}{unit}"


def _spread(vs, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    """ "median (min-max)" of a list's values, or "not measured"."""
    vs = [v for v in vs or [] if v is not None]
    if not vs:
        return "not measured"
    m, lo, hi = (_f(x, scale, digits) for x in (statistics.median(vs), min(vs), max(vs)))
    return f"{m} ({lo}-{hi}){unit}"


def _peaks(r: dict, key: str = "peak") -> list[int]:
    return [v[key] for k, v in r["cold"]["store"].items() if k != "head"]


TABLE = (
    ("samples / real tokens", lambda r: f"{r['samples']:,} / {r['tokens'] / 1e6:,.0f}M"),
    ("nodes x ranks per node", lambda r: f"{r['nodes']} x {r['ranks_per_node']}"),
    ("window tokens (windows / epoch)", lambda r: f"{r['window_tokens']:,} ({r['windows']})"),
    ("largest window's blocks", lambda r: _f(r["window_bytes"], MIB, 0, " MiB")),
    ("index build / edges / plan", lambda r: f"{r['index_build_s']:.1f} / {r['edges_s']:.2f} / {r['plan_s']:.2f} s"),
    ("first window ready after feeder start", lambda r: _f(r["cold"]["first_range_ready_s"], 1, 1, " s")),
    ("cold run: steps, wall time", lambda r: f"{r['cold']['stop_step']:,}, {r['cold']['wall_s']:.0f} s"),
    ("first step, cold: median (min-max) over ranks", lambda r: _spread(r["cold"]["first_step_s"], unit=" s")),
    ("first step, resume: median (min-max)", lambda r: _spread((r["resume"] or {}).get("first_step_s"), unit=" s")),
    ("preparation rate, first range (the first window, without lead-in)", lambda r: _f(r["cold"]["prep"]["first_tokens_per_s"], 1e6, 1, "M tok/s")),
    ("preparation rate, ranges consumed", lambda r: _f(r["cold"]["prep"]["sustained_tokens_per_s"], 1e6, 1, f"M tok/s ({r['cold']['prep']['ranges']})")),
    ("consumer rate per rank: median (min-max)", lambda r: _spread([x["tokens_per_s"] for x in r["cold"]["rates"]], 1e6, 1, "M tok/s")),
    ("rank time waiting: median (min-max)", lambda r: _spread([x["wait_share"] for x in r["cold"]["rates"]], 0.01, 0, " %")),
    ("store peak per worker node: median (min-max)", lambda r: _spread(_peaks(r), MIB, 0, " MiB")),
    ("its primary copies: median (min-max)", lambda r: _spread(_peaks(r, "peak_primary"), MIB, 0, " MiB")),
    ("store peak per node / window bytes (max): in use, primary", lambda r: f"{_f(max(_peaks(r)) / r['window_bytes'], 1, 2)}, {_f(max(_peaks(r, 'peak_primary')) / r['window_bytes'], 1, 2)}"),
    ("spilled, all nodes", lambda r: _f(sum(v.get("spilled", 0) for v in r["cold"]["store"].values()), MIB, 0, " MiB")),
    ("sent / own ranks' bytes, worst node (head: sent)", lambda r: f"{_f(r['cold']['bytes']['max_sent_per_own'], 1, 2)} ({_f(r['cold']['bytes']['nodes'].get('head', {}).get('sent', 0), MIB, 0, ' MiB')})"),
    ("blocks copied to their rank's node after the pass", lambda r: _f(sum(x.get("bytes_placed", 0) for x in r["cold"].get("ranges", [])), MIB, 0, " MiB")),
    ("rank's bytes on its node when handed: median (min-max)", lambda r: _spread([x["local_share"] for x in r["cold"]["bytes"]["ranks"]], 0.01, 0, " %")),
    ("row groups read / window's, windows prepared", lambda r: f"{_f(r['reads']['read_per_row_group'], 1, 2)} ({len(r['reads']['windows'])} windows, exactly once: {'yes' if r['reads']['exactly_once'] else 'NO'})"),
    ("resume's first range: row groups read / window's", lambda r: "not measured" if not r["resume_reads"] else f"{r['resume_reads']['row_groups_read']} / {r['resume_reads']['of_window']}"),
    ("prepared windows' blocks held at once (feeder's peak)", lambda r: _f(r["cold"]["feeder_peak_held_bytes"], MIB, 0, " MiB")),
    ("wall time; load avg before -> after", lambda r: f"{r['wall_s']:.0f} s; {r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f}"),
    ("measured (UTC)", lambda r: r["date_utc"]),
)  # fmt: skip


def render(rows: list[dict], machine: dict | None = None) -> str:
    """The Markdown table, one column per corpus size, and a line on the machine."""
    rows = sorted(rows, key=lambda r: r["samples"])
    out = ["| | " + " | ".join(f"{r['samples']:,}" for r in rows) + " |"]
    out.append("|---" * (len(rows) + 1) + "|")
    out += [f"| {name} | " + " | ".join(fn(r) for r in rows) + " |" for name, fn in TABLE]
    if m := machine:
        out.append(
            f"\nMachine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('ram_gib')} GiB RAM; "
            f"Ray {m.get('ray')}; commit {m.get('git_commit') or 'unknown'}"
            + (" (dirty)" if m.get("git_dirty") else "")
        )
    return "\n".join(out)


@contextmanager
def simulated_cluster(nodes: int, store_bytes: int, head_store_bytes: int):
    """A head with no CPU (driver, feeder) and `nodes` one-CPU worker nodes, each with its own
    object store and a custom resource `node<i>`; yields {node id: "head" | "node<i>"}."""
    import ray
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 0, "include_dashboard": False, "object_store_memory": head_store_bytes}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        names = {cluster.head_node.node_id: "head"}
        each = {"num_cpus": 1, "object_store_memory": store_bytes}
        for i in range(nodes):
            names[cluster.add_node(resources={f"node{i}": 1}, **each).node_id] = f"node{i}"
        ray.init(address=cluster.address, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        cluster.wait_for_nodes()
        yield names
    finally:
        ray.shutdown()
        cluster.shutdown()


class RankActor:
    """One rank: a zero-CPU process pinned to its node, warmed (imports done) before the clock
    starts, that pulls its micro-batches through `rank_batches` a few steps per call, and
    records where each part's blocks are stored as it accepts the part (`PartLocations`; the
    seconds that takes are left out of the stream's)."""

    def warm(self) -> str:
        import pandas  # noqa: F401  (pyarrow's to_numpy imports it on first use)
        import ray
        import torch  # noqa: F401

        import pipeline.data.rechunk  # noqa: F401

        self.where = PartLocations()
        return ray.get_runtime_context().get_node_id()

    def start(self, name: str, start: int, stop: int, rank: int, world: int, plan_hash: str):
        self.where.blocks, self.where.seconds, self.stop = [], 0.0, stop
        self.rec = {"began": time.time(), "first": None, "steps": [], "real": [], "secs": []}
        self.it = rank_batches(
            name, epoch=0, start_step=start, rank=rank, world_size=world, plan_hash=plan_hash
        )

    def take(self, n: int) -> tuple[bool, int]:
        """The next `n` micro-batches; (whether steps remain, the last step)."""
        r = self.rec
        for _ in range(n):
            t, spied = time.perf_counter(), self.where.seconds
            mb = next(self.it, None)
            if mb is None:
                return False, r["steps"][-1] if r["steps"] else -1
            r["secs"].append(time.perf_counter() - t - (self.where.seconds - spied))
            r["first"] = r["first"] or time.time()
            r["steps"].append(mb.step)
            r["real"].append(mb.num_real_tokens)
            if mb.step + 1 >= self.stop:
                return False, mb.step
        return True, r["steps"][-1]

    def finish(self) -> dict:
        self.it.close()
        return self.rec | {"end": time.time(), "blocks": self.where.blocks}


RANGE_KEYS = (
    "start_step", "end_step", "chapter", "tokens", "bytes", "row_groups_read", "rows_sorted",
    "rows_held", "rows_carried_out", "in_feeder", "plan_s", "sort_s", "split_s", "bytes_placed",
    "place_s",
)  # fmt: skip


def _lockstep(s: SimpleNamespace, log, label: str) -> None:
    """Drive the ranks `s.sync` steps at a time, all in step, until they reach their stop."""
    import ray

    live, last = list(s.pool), time.time()
    while live:
        got = ray.get([c.take.remote(s.sync) for c in live])
        live = [c for c, (more, _) in zip(live, got, strict=True) if more]
        if time.time() - last > 15:
            last = time.time()
            log(f"{label}: step {max(step for _, step in got)}")


def _run(s: SimpleNamespace, start: int, stop: int, log, label: str) -> dict:
    """One feeder from start to finish: every rank consumes steps [start, stop)."""
    import ray

    world = len(s.pool)
    with NodeStorePeaks() as store:
        t0 = time.time()
        feeder = start_feeder(s.cfg, s.index, s.edges, name=FEEDER, path=s.path, prefetch=True)
        try:
            args = (FEEDER, start, stop)
            ray.get([c.start.remote(*args, r, world, s.plan_hash) for r, c in enumerate(s.pool)])
            _lockstep(s, log, label)
            recs = ray.get([c.finish.remote() for c in s.pool])
            hist = sorted(ray.get(feeder.history.remote()), key=lambda h: h["start_step"])
            held = ray.get(feeder.memory.remote())["peak_held_bytes"]
        finally:
            stop_feeder(FEEDER)
    waits = {start} | {h["start_step"] for h in hist}
    rates = [rank_rate(r, waits) for r in recs]
    nm = s.names.get
    blocks = [(i, z, [nm(n, n) for n in w]) for i, r in enumerate(recs) for z, w in r["blocks"]]
    ranges = [{k: h[k] for k in RANGE_KEYS} | {"ready_s": h["done_at"] - t0} for h in hist]
    placed: dict = {}  # what each node sent placing the consumed ranges' blocks
    for h in hist:
        for node, size in (h["placed_from"] if h["start_step"] < stop else {}).items():
            placed[nm(node, node)] = placed.get(nm(node, node), 0) + size
    log(f"{label}: done in {time.time() - t0:.0f} s, {len(hist)} ranges prepared")
    return {
        "wall_s": max(r["end"] for r in recs) - t0,
        "start_step": start,
        "stop_step": stop,
        "first_step_s": [r["first"] - t0 for r in recs],
        "first_range_ready_s": ranges[0]["ready_s"] if ranges else None,
        "ranges": ranges,
        # the ranges consumed, not the one prepared ahead
        "prep": prep_rates([h for h in hist if h["start_step"] < stop]),
        "rates": rates,
        "bytes": node_bytes(blocks, s.rank_node, sorted(set(s.names.values())), placed),
        "store": {s.names.get(k, k): v for k, v in store.nodes.items()},
        "feeder_peak_held_bytes": held,
    }


def _plan_inputs(data_dir: str, cache: str, world: int, window_tokens, lead_in: bool) -> dict:
    """Index, edges and epoch plan, each timed, with the windowed config."""
    base = {
        "data": {"path": data_dir, "cache_dir": cache},
        "delivery": {"lead_tokens": DEFAULT_LEAD_TOKENS} if lead_in else {},
        "model": {"vocab_size": VOCAB},
        "scaling": {"num_workers": world},
    }
    t = time.perf_counter()
    index = build_length_index(RunConfig.model_validate(base))
    index_s = time.perf_counter() - t
    rg = row_group_of(index.file_idx, index.rows, index.row_groups)
    rg_tokens = np.bincount(rg, weights=index.lengths.astype(np.float64))
    wt = int(window_tokens or default_window_tokens(rg_tokens))
    cfg = RunConfig.model_validate(base | {"plan": {"window_tokens": wt}})
    t = time.perf_counter()
    edges = resolve_edges(cfg, index.lengths)
    edges_s = time.perf_counter() - t
    t = time.perf_counter()
    plan = epoch_plan_for(cfg, index, edges, 0, world)
    plan_s = time.perf_counter() - t
    window = epoch_windows(cfg, index, 0)
    n_win = int(window.max()) + 1
    window_rgs = [int(np.unique(rg[window == w]).size) for w in range(n_win)]
    times = {"index_build_s": index_s, "edges_s": edges_s, "plan_s": plan_s}
    return dict(cfg=cfg, index=index, edges=edges, plan=plan, window_tokens=wt, times=times,
                window_rgs=window_rgs)  # fmt: skip


def _ranks(names: dict, nodes: int, per_node: int) -> tuple[list, list[str]]:
    """The rank actors, rank r on node r // per_node, warmed; (actors, each rank's node)."""
    import ray

    actor = ray.remote(num_cpus=0, max_concurrency=1)(RankActor)
    pool = [
        actor.options(resources={f"node{r // per_node}": 0.001}).remote()
        for r in range(nodes * per_node)
    ]
    where = [names.get(n, n) for n in ray.get([c.warm.remote() for c in pool])]
    want = [f"node{r // per_node}" for r in range(nodes * per_node)]
    if where != want:
        raise RuntimeError(f"ranks placed on {where}, not {want}")
    return pool, where


SETTINGS = ("nodes", "ranks_per_node", "store_gib", "lead_in", "sync_steps", "resume_steps")


def measure_size(n: int, a: argparse.Namespace, log) -> dict:
    """One corpus size on a fresh simulated cluster (see the module docstring)."""
    data_dir = str(Path(a.work) / f"seed902k-{n}-{SHARDS}")
    log(f"{n:,} samples: corpus under {data_dir}")
    write_corpus(data_dir, num_samples=n, shards=SHARDS, vocab_size=VOCAB)
    t_start, load0, world = time.perf_counter(), loadavg(), a.nodes * a.ranks_per_node
    store = int(a.store_gib * 2**30)
    with (
        simulated_cluster(a.nodes, store, HEAD_STORE_BYTES) as names,
        tempfile.TemporaryDirectory(prefix="index-", dir=a.work) as cache,
    ):
        log(f"{n:,}: cluster up ({a.nodes} nodes); warming {world} ranks")
        pool, rank_node = _ranks(names, a.nodes, a.ranks_per_node)
        p = _plan_inputs(data_dir, cache, world, a.window_tokens, a.lead_in)
        plan = p["plan"]
        ws = plan.window_steps if plan.window_steps is not None else [0, plan.num_steps]
        ws = np.asarray(ws, dtype=np.int64)
        log(f"{n:,}: {ws.size - 1} windows of ~{p['window_tokens']:,} tokens, {plan.num_steps} steps")  # fmt: skip
        s = SimpleNamespace(cfg=p["cfg"], index=p["index"], edges=p["edges"], path=data_dir,
            pool=pool, rank_node=rank_node, names=names, plan_hash=plan.content_hash,
            sync=a.sync_steps)  # fmt: skip
        k = min(a.windows_consumed, ws.size - 1)  # cold: the first k windows
        cold = _run(s, 0, int(ws[k]), log, f"{n:,} cold")
        w, resume = min(k, ws.size - 2), None  # resume: half-way through the next window
        if a.resume_steps:
            mid = int(ws[w] + ws[w + 1]) // 2
            stop = min(int(ws[w + 1]), mid + a.resume_steps)
            resume = _run(s, mid, stop, log, f"{n:,} resume at step {mid} (window {w})")
    rr = resume["ranges"][0] if resume and resume["ranges"] else None  # its first range
    rr = rr and {"row_groups_read": rr["row_groups_read"], "of_window": p["window_rgs"][w]}
    return {
        "samples": n,
        "tokens": int(p["index"].num_tokens),
        **{k: getattr(a, k) for k in SETTINGS},
        "window_tokens": p["window_tokens"],
        "windows": int(ws.size - 1),
        "windows_consumed": k,
        "window_steps": ws.tolist(),
        "window_bytes": max((h["bytes"] for h in cold["ranges"]), default=None),
        "window_bytes_nominal": 4 * p["window_tokens"],
        **p["times"],
        "cold": cold,
        "resume": resume,
        "reads": read_check(cold["ranges"], p["window_rgs"]),
        "resume_reads": rr,
        "load_before": load0,
        "load_after": loadavg(),
        "wall_s": time.perf_counter() - t_start,
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.window_cluster", description=__doc__.splitlines()[0])  # fmt: skip
    sizes = f"{PRESETS['seed902k']},2000000"
    p.add_argument("--samples", default=sizes, help="comma-separated corpus sizes (%(default)s)")
    p.add_argument("--nodes", type=int, default=4, help="worker nodes (%(default)s)")
    p.add_argument("--ranks-per-node", type=int, default=2, help="(%(default)s)")
    p.add_argument("--window-tokens", type=int, default=None, help="default: tokens / 16")
    p.add_argument("--windows-consumed", type=int, default=3, help="cold run (%(default)s)")
    p.add_argument("--resume-steps", type=int, default=8, help="0: no resume (%(default)s)")
    p.add_argument("--sync-steps", type=int, default=1, help="steps per lockstep (%(default)s)")
    p.add_argument("--store-gib", type=float, default=2.0, help="per worker node (%(default)s)")
    p.add_argument("--lead-in", action="store_true", help="a 2**22-token lead-in (off: none)")
    p.add_argument(
        "--json",
        "--out",
        dest="json",
        default="benchmarks/window_cluster.json",
        help="(%(default)s)",
    )
    p.add_argument("--work", default="out/window_cluster", help="corpora (%(default)s)")
    a = p.parse_args(argv)
    a.sizes = [int(x) for x in a.samples.split(",") if x.strip()]
    if any(x < 1000 for x in a.sizes) or a.nodes < 1 or a.ranks_per_node < 1:
        p.error("--samples must be >= 1000 each, --nodes and --ranks-per-node >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    Path(a.work).mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[window_cluster] {msg}", file=sys.stderr, flush=True)

    path = Path(a.json)
    out = json.loads(path.read_text()) if path.is_file() else {}
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "bench.window_cluster", *argv])
    commands = [c for c in out.get("meta", {}).get("commands", []) if c != command]
    out["meta"] = {"commands": [*commands, command], "machine": machine_info()}
    sizes = out.setdefault("sizes", {})
    for n in a.sizes:
        sizes[str(n)] = measure_size(n, a, log)  # replaced when measured again
        sizes[str(n)]["git_commit"] = out["meta"]["machine"]["git_commit"]
        sizes[str(n)]["command"] = command
        write_json(path, out)
        log(f"{n:,}: {sizes[str(n)]['wall_s']:.0f} s; wrote {path}")
    print(render(list(sizes.values()), out["meta"]["machine"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
