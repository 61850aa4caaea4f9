"""Shared pieces of the fault-injection suite: one tiny config, one uninterrupted reference run
per session, and the check every fault test ends with — after recovery, exactly the reference's
batches; over the epoch, every sample exactly once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.config import RunConfig, load_config

REPO = Path(__file__).resolve().parents[2]
BASE_CONFIG = REPO / "configs" / "local.yaml"
CHECKPOINT_EVERY = 10
KILL_AFTER = 25  # steps trained before a fault on the global plan: resumed at step 10 or 20

# A windowed epoch on the same tiny corpus cut into eight shards (row groups of ~19K real tokens):
# three windows, starting at steps [0, 29, 48] of 81 at two workers. At the delivery defaults for
# windows (no row cache, no lead-in) each window is one Ray Data pass over its own row groups,
# its carried rows held between passes.
WINDOWED = ["data.synthetic.shards=8", "plan.window_tokens=60000"]
# The last whole checkpoint at this point is at step 30 or 40: inside the second window.
WINDOW_KILL_AFTER = 45


def fault_overrides(data_dir: Path, tmp: Path, name: str, *extra: str) -> list[str]:
    """~1,500 samples cut at 128 tokens, a 1-layer d_model 32 model, 2 workers at 0.5 CPU,
    one epoch of ~95 global steps, a checkpoint every 10 steps, sample ids recorded."""
    return [
        f"data.synthetic.out_dir={data_dir}",
        "data.synthetic.num_samples=1500",
        "data.max_length=128",
        "data.over_length=truncate",
        "buckets.num_buckets=3",
        "batching.token_budget=2048",
        "model.d_model=32",
        "model.n_layers=1",
        "model.n_heads=2",
        "model.d_ff=64",
        "train.epochs=1",
        "train.warmup_steps=5",
        "train.warmup_ratio=null",
        "train.log_every=10",
        f"train.record_sample_ids={tmp / 'ids'}",
        "wandb.mode=disabled",
        "scaling.num_workers=2",
        "scaling.cpus_per_worker=0.5",
        f"checkpoint.storage_path={tmp / 'runs'}",
        f"checkpoint.run_name={name}",
        f"checkpoint.every_steps={CHECKPOINT_EVERY}",
        "checkpoint.keep_last=3",
        "checkpoint.max_failures=1",
        *extra,
    ]


def fault_config(data_dir: Path, tmp: Path, name: str, *extra: str) -> RunConfig:
    return load_config(BASE_CONFIG, fault_overrides(data_dir, tmp, name, *extra))


# --------------------------------------------------------------------------- recorded samples


def read_records(ids_dir: Path) -> list[dict]:
    """Every rank's records in file order. A process killed mid-write can leave one torn line
    at the end of an attempt; it is skipped (the step is re-run and recorded again)."""
    out = []
    for f in sorted(Path(ids_dir).glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def attempts(records: list[dict], rank: int) -> list[tuple[dict, list[dict]]]:
    """Rank `rank`'s attempts: (start event, the micro-batches it trained), in order."""
    out: list[tuple[dict, list[dict]]] = []
    for r in records:
        if r["rank"] != rank:
            continue
        if r.get("event") == "start":
            out.append((r, []))
        else:
            out[-1][1].append(r)
    return out


def trained_steps(records: list[dict]) -> int:
    """Distinct (epoch, step) pairs recorded so far by rank 0."""
    return len({(r["epoch"], r["step"]) for r in records if r["rank"] == 0 and "ids" in r})


def global_batches(records: list[dict]) -> dict[tuple[int, int], list[int]]:
    """(epoch, step) -> the sorted sample ids of that global step over all ranks, as the latest
    attempt that trained it saw them (a re-run step counts once; a resized attempt's ranks
    replace the old ones)."""
    seen: dict[int, int] = {}
    latest: dict[tuple[int, int], tuple[int, list[int]]] = {}
    for r in records:
        if r.get("event") == "start":
            seen[r["rank"]] = seen.get(r["rank"], -1) + 1
            continue
        key, k = (r["epoch"], r["step"]), seen[r["rank"]]
        if key not in latest or latest[key][0] < k:
            latest[key] = (k, list(r["ids"]))
        elif latest[key][0] == k:
            latest[key][1].extend(r["ids"])
    return {key: sorted(ids) for key, (_, ids) in latest.items()}


@dataclass(frozen=True)
class Recovery:
    resumed_at: int  # first global step of the last attempt
    rerun_steps: int  # steps trained before the fault and again after it
    attempts: int
    world_after: int  # ranks in the last attempt


def assert_exact_recovery(records: list[dict], reference: list[dict]) -> Recovery:
    """The contract-7 check of every fault test, on the recorded (epoch, step, rank, ids):

    - every global step has exactly the reference's samples; when the last attempt has the
      reference's world size, every micro-batch ever trained (re-runs included) is the
      reference's, rank by rank (contract 8 promises only the global batches otherwise);
    - the last attempt starts at a checkpointed step c > 0 and trains exactly the reference's
      steps c .. S-1, in order, on every rank;
    - nothing was skipped: the attempts together cover every step, and the epoch's samples are
      each trained exactly once after de-duplicating re-run steps.
    """
    ref_mb = {(r["epoch"], r["step"], r["rank"]): r["ids"] for r in reference if "ids" in r}
    ref_world = len({r["rank"] for r in reference})
    ref_steps = sorted({(e, s) for e, s, _ in ref_mb})
    ranks = sorted({r["rank"] for r in records})
    n_attempts = max(len(attempts(records, r)) for r in ranks)
    last_ranks = [r for r in ranks if len(attempts(records, r)) == n_attempts]
    same_world = len(last_ranks) == ref_world
    if same_world:
        for r in records:
            if "ids" in r:
                key = (r["epoch"], r["step"], r["rank"])
                assert r["ids"] == ref_mb[key], f"micro-batch {key} differs from the reference"
    ref_gb = global_batches(reference)
    got_gb = global_batches(records)
    assert got_gb == ref_gb, "global batches differ from the reference"

    last_starts = []
    for rank in last_ranks:
        start, trained = attempts(records, rank)[-1]
        c = start["step"]
        want = [(e, s) for e, s in ref_steps if (e, s) >= (start["epoch"], c)]
        assert [(r["epoch"], r["step"]) for r in trained] == want, f"rank {rank} after restart"
        if same_world:
            assert [r["ids"] for r in trained] == [ref_mb[(e, s, rank)] for e, s in want]
        last_starts.append((start["epoch"], c))
    assert len(set(last_starts)) == 1, f"ranks resumed at different steps: {last_starts}"
    epoch, c = last_starts[0]
    assert c > 0 and c % CHECKPOINT_EVERY == 0, f"resumed at step {c}, not at a checkpoint"

    for e in {e for e, _ in ref_steps}:
        ids = [i for (ee, _), v in got_gb.items() if ee == e for i in v]
        ref_ids = [i for (ee, _), v in ref_gb.items() if ee == e for i in v]
        assert len(ids) == len(set(ids)) == len(ref_ids), f"epoch {e}: samples lost or repeated"
        assert set(ids) == set(ref_ids)

    before = {
        (r["epoch"], r["step"]) for a in attempts(records, 0)[:-1] for r in a[1] if "ids" in r
    }
    return Recovery(
        resumed_at=c,
        rerun_steps=sum(1 for k in before if k >= (epoch, c)),
        attempts=n_attempts,
        world_after=len(last_ranks),
    )


# --------------------------------------------------------------------------- fault helpers


def kill_when(
    ids_dir: Path,
    *,
    after_steps: int,
    rank: int,
    timeout: float = 300.0,
    kill: Callable[[int], None] | None = None,
) -> tuple[threading.Thread, dict]:
    """A thread that waits until rank 0 has recorded `after_steps` steps, then SIGKILLs the pid
    of `rank`'s latest attempt (or calls `kill(pid)`); `info` gets the pid, the steps recorded
    at the kill, its monotonic time and `recovery_s`: seconds until a new attempt trained a step."""
    info: dict = {}

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and "t" not in info:
            recs = read_records(ids_dir) if Path(ids_dir).is_dir() else []
            if trained_steps(recs) >= after_steps:
                pid = attempts(recs, rank)[-1][0]["pid"]
                (kill or (lambda p: os.kill(p, signal.SIGKILL)))(pid)
                n = len(attempts(recs, 0))
                info.update(pid=pid, steps_at_kill=trained_steps(recs), attempts=n)
                info["t"] = time.monotonic()
            time.sleep(0.005)
        # Then the recovery time: until the next attempt has trained its first step.
        while time.monotonic() < deadline and "t" in info:
            recs = read_records(ids_dir)
            runs = attempts(recs, 0)
            if len(runs) > info["attempts"] and runs[-1][1]:
                info["recovery_s"] = round(time.monotonic() - info["t"], 1)
                return
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t, info


# --------------------------------------------------------------------------- reference run


@pytest.fixture(scope="session")
def fault_data(tmp_path_factory) -> Path:
    """The synthetic corpus every fault test reads (generated once, on first use)."""
    return tmp_path_factory.mktemp("fault-data")


def _reference_run(data: Path, tmp: Path, name: str, *extra: str) -> dict:
    """An uninterrupted run, on its own local Ray instance: its records, its summary, and the
    epoch-0 plan's window starts at 2 workers (`EpochPlan.window_steps`; None without windows)."""
    import ray

    from pipeline.data import build_length_index, epoch_plan_for, resolve_edges
    from pipeline.train.launch import run

    cfg = fault_config(data, tmp, name, *extra)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        t0 = time.monotonic()
        summary = run(cfg)
        seconds = time.monotonic() - t0
        index = build_length_index(cfg)
        plan = epoch_plan_for(cfg, index, resolve_edges(cfg, index.lengths), 0, 2)
    finally:
        ray.shutdown()
    records = read_records(tmp / "ids")
    return {
        "records": records,
        "summary": summary,
        "seconds": seconds,
        "tmp": tmp,
        "window_steps": plan.window_steps,
    }


@pytest.fixture(scope="session")
def reference(fault_data, tmp_path_factory) -> dict:
    """The uninterrupted run, on its own local Ray instance: its records and summary."""
    return _reference_run(fault_data, tmp_path_factory.mktemp("reference"), "reference")


@pytest.fixture(scope="session")
def window_data(tmp_path_factory) -> Path:
    """The corpus of the windowed fault tests (eight shards: `WINDOWED`), generated on first use."""
    return tmp_path_factory.mktemp("window-fault-data")


@pytest.fixture(scope="session")
def window_reference(window_data, tmp_path_factory) -> dict:
    """The uninterrupted windowed run (`WINDOWED`), on its own local Ray instance."""
    tmp = tmp_path_factory.mktemp("window-reference")
    return _reference_run(window_data, tmp, "window-reference", *WINDOWED)


@dataclass(frozen=True)
class FaultCase:
    """One fault test's setting: the corpus, the extra overrides, the uninterrupted run to match
    and after how many trained steps the fault is injected."""

    windowed: bool
    data: Path
    extra: tuple[str, ...]
    reference: dict
    kill_after: int

    def assert_inside_a_later_window(self, step: int) -> None:
        """With windows: the plan has several, and global step `step` (where the fault hit, or
        where the run resumed) is inside one that is not the first (not at its start either)."""
        if not self.windowed:
            return
        ws = self.reference["window_steps"]
        assert ws is not None and ws.size - 1 >= 2, f"expected several windows: {ws}"
        w = int(np.searchsorted(ws, step, side="right")) - 1
        assert 1 <= w < ws.size - 1 and ws[w] < step < ws[w + 1], (step, ws.tolist())


@pytest.fixture(params=[False, True], ids=["global", "windowed"])
def fault_case(request, fault_data) -> FaultCase:
    """The test once on the global plan, once windowed (`WINDOWED`, injected at
    `WINDOW_KILL_AFTER`). Name it before any fixture that starts Ray (`two_nodes`): the windowed
    reference, started from here on first use, runs on its own local instance."""
    if request.param:
        ref = request.getfixturevalue("window_reference")
        data = request.getfixturevalue("window_data")
        return FaultCase(True, data, tuple(WINDOWED), ref, WINDOW_KILL_AFTER)
    ref = request.getfixturevalue("reference")
    return FaultCase(False, fault_data, (), ref, KILL_AFTER)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance per module (never someone else's cluster)."""
    from tests.ray.conftest import private_ray

    with private_ray(log_to_driver=False):
        yield


def report(name: str, **figures) -> None:
    """Print one line of measured figures (collected into docs/reliability.md by hand; run
    pytest with -s to see them)."""
    print(f"\n[faults] {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
