"""Every baseline policy collates under the shipped demo config as it is, without Ray: its plan
batches all lengths together (one bucket up to the top edge) and collation pads within the
plan's own edges, not the config's eight (a sorted plan used to stop at its first batch with
"batch max length 512 exceeds its bucket's upper edge 77"). The same on a local Ray run:
tests/ray/test_baseline_policies.py (slow)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest

from pipeline.core.config import load_config
from pipeline.core.epochs import epoch_plan_for, resolve_edges
from pipeline.data.rechunk import deliver


@dataclass(frozen=True)
class _Index:
    lengths: np.ndarray
    sample_ids: np.ndarray


@pytest.mark.parametrize("policy", ["sorted", "random", "megabatch", "sorted_ascending"])
def test_every_baseline_collates_a_whole_epoch_on_the_shipped_demo_config(policy):
    cfg = load_config("configs/local.yaml", [f"plan.policy={policy}"])
    rng = np.random.default_rng(0)
    n = 1500
    lengths = rng.integers(1, cfg.data.max_length + 1, n).astype(np.int64)
    ids = np.arange(n, dtype=np.int64) * 3 + 1
    edges = resolve_edges(cfg, lengths)
    assert len(edges) > 2  # the config's own buckets: several edges below the top
    plan = epoch_plan_for(cfg, _Index(lengths, ids), edges, 0, 1)
    view = plan.rank_view(0)
    rows = np.searchsorted(ids, view.sample_ids)
    table = pa.table(
        {
            "sample_id": pa.array(view.sample_ids, pa.int64()),
            "input_ids": pa.array(
                [np.full(int(lengths[r]), 7, np.int32) for r in rows], pa.list_(pa.int32())
            ),
        }
    )
    mbs = list(deliver(view, [table], epoch=0))
    assert len(mbs) == len(view.offsets) - 1
    assert max(mb.input_ids.shape[1] for mb in mbs) > edges[1]  # padded within the plan's edges
    assert sum(mb.num_real_tokens for mb in mbs) == int(lengths.sum())  # every sample once
