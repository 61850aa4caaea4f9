"""Every baseline policy collates under the shipped demo config switched to padded batches as its
refusal of packed rows says (`PADDED`), without Ray: its plan batches all lengths together (one
bucket up to the top edge) and collation pads within the plan's own edges, not the config's
optimal ones (a sorted plan used to stop at its first batch with "batch max length 512 exceeds
its bucket's upper edge 77"). The same on a local Ray run: tests/ray/test_baseline_policies.py
(slow)."""

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


# What the demo's refusal of a baseline policy with packed rows names: a packed step's tokens.
PADDED = ["batching.mode=token_budget", "batching.token_budget=16384"]


@pytest.mark.parametrize("policy", ["sorted", "random", "megabatch", "sorted_ascending"])
def test_every_baseline_collates_a_whole_epoch_on_the_shipped_demo_config(policy):
    # eight buckets, as the demo had before it packed rows: the config's edges are not the plan's
    cfg = load_config(
        "configs/local.yaml", [f"plan.policy={policy}", *PADDED, "buckets.num_buckets=8"]
    )
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


@pytest.mark.parametrize("policy", ["sorted", "random", "megabatch", "sorted_ascending"])
def test_auto_edges_under_a_baseline_are_one_bucket_not_a_search(policy, recwarn):
    # A baseline batches across all lengths: searching K for a padding target it ignores only
    # warned "even 64 buckets reach only 0.54 padding efficiency".
    cfg = load_config("configs/local.yaml", [f"plan.policy={policy}", *PADDED])
    assert cfg.buckets.num_buckets == "auto"
    lengths = np.random.default_rng(1).integers(1, 513, 2000)
    assert resolve_edges(cfg, lengths) == [0, int(lengths.max())]
    assert not [w for w in recwarn if "buckets" in str(w.message)]
    bucketed = load_config("configs/local.yaml", PADDED)
    assert len(resolve_edges(bucketed, lengths)) > 2  # the bucketed policy still searches
