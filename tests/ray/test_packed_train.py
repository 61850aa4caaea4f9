"""batching.mode=packed end to end through `pipeline.train.launch.run`: a packed run that fails
after step FAIL_AFTER and restarts from its step-CHECKPOINT_EVERY checkpoint trains, rank by rank
and step by step, exactly the rows of the packed plan (what an uninterrupted run trains: the plan
is a pure function of the config and the index), every sample once per epoch, and logs the packed
epoch/* and data/* metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.config import validate
from pipeline.core.epochs import epoch_plan_for, resolve_edges
from pipeline.data import build_length_index
from pipeline.train.launch import run
from pipeline.train.loop import FAIL_AT_STEP_ENV, FAIL_MARKER_ENV
from tests.helpers import tiny_raw

pytestmark = pytest.mark.ray

CHECKPOINT_EVERY, FAIL_AFTER = 10, 14
PACKED = {"mode": "packed", "row_tokens": 256, "rows_per_step": 4}


def _records(ids_dir: Path) -> list[dict]:
    return [
        json.loads(x)
        for f in sorted(ids_dir.glob("rank*.jsonl"))
        for x in f.read_text().splitlines()
    ]


# A whole packed run (~40-90 s): make test-slow. The default suite keeps packed plans, slices,
# chapters and re-chunking (tests/unit/test_packed_plan.py) and the packed config (test_packed_config.py).
@pytest.mark.slow
def test_packed_run_resumed_after_a_failure_trains_every_planned_row_once(
    cluster, tmp_path, monkeypatch
):
    monkeypatch.setenv(FAIL_AT_STEP_ENV, str(FAIL_AFTER))
    monkeypatch.setenv(FAIL_MARKER_ENV, str(tmp_path / "failed-once"))
    cfg = validate(
        tiny_raw(
            tmp_path,
            batching=PACKED,
            buckets={"num_buckets": "auto"},  # packed: one bucket, a full shuffle
            train={
                "metrics_file": str(tmp_path / "metrics.jsonl"),
                "record_sample_ids": str(tmp_path / "ids"),
                "log_every": 1,
            },
            checkpoint={"run_name": "packed", "every_steps": CHECKPOINT_EVERY, "max_failures": 1},
        )
    )
    summary = run(cfg)

    # It failed after FAIL_AFTER steps and restarted from the checkpoint, on every rank.
    recs = _records(tmp_path / "ids")
    starts = sorted((r["rank"], r["step"]) for r in recs if r.get("event") == "start")
    assert starts == [(0, 0), (0, CHECKPOINT_EVERY), (1, 0), (1, CHECKPOINT_EVERY)]

    # The packed plan, as the driver and the feeder make it.
    index = build_length_index(cfg)
    edges = resolve_edges(cfg, index.lengths)
    assert len(edges) == 2  # auto in packed mode: one bucket
    plans = [epoch_plan_for(cfg, index, edges, e, 2) for e in range(cfg.train.epochs)]
    assert all(p.packed for p in plans)
    assert summary.steps == sum(p.num_steps for p in plans) > FAIL_AFTER

    # Every rank trained exactly its planned rows at every step, also after the restart (the
    # steps it trained twice hold the same samples both times), so every sample once per epoch.
    trained = {}
    for r in recs:
        if "ids" in r:
            key = (r["epoch"], r["step"], r["rank"])
            assert trained.setdefault(key, r["ids"]) == r["ids"], key
    want = {}
    for p in plans:
        for rank in (0, 1):
            v = p.rank_view(rank)
            for m, step in enumerate(v.steps):
                ids = v.sample_ids[v.offsets[m] : v.offsets[m + 1]].tolist()
                want[(p.epoch, int(step), rank)] = ids
    assert {k: v for k, v in trained.items() if v} == {k: v for k, v in want.items() if v}
    for e in range(cfg.train.epochs):
        ids = np.concatenate([v for k, v in trained.items() if k[0] == e])
        assert np.array_equal(np.sort(ids), np.sort(index.sample_ids))

    # The packed metrics: per epoch from the plan, per logged step from what was trained.
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    epochs = [m for m in metrics if "epoch/rows" in m]
    assert [m["epoch/rows"] for m in epochs[:2]] == [p.rows.num_rows for p in plans]
    for m in epochs:
        assert 0.5 < m["epoch/row_fill"] == m["epoch/planned_padding_efficiency"] <= 1.0
        assert 1.0 <= m["epoch/rank_max_over_mean"] < 1.5
        assert m["epoch/docs_per_row"] > 1.0
    steps = [m for m in metrics if "data/rows" in m]
    assert steps and all(0 < m["data/rows"] <= PACKED["rows_per_step"] for m in steps)
    assert all(0 < m["data/row_fill"] <= 1.0 and m["data/docs_per_row"] >= 1 for m in steps)
