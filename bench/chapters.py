"""Parquet bytes read per epoch against the number of chapters, on the synthetic corpus layout.

Pure numpy: the preset's lengths, the shard and row-group layout `corpus.write_corpus` produces
(sample ids = global row numbers, `shards` files, `rg_rows` rows per row group), the team's
edges and token budget. A row group's cost is its uncompressed size (4 bytes per int32 token plus
the 8-byte sample id), what a reader decodes whatever the compression.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.chapters import chapter_bounds, chapter_read_bytes, row_group_of, step_tokens
from pipeline.core.config import TEAM_EDGES, BatchingConfig, PlanConfig
from pipeline.core.plan import epoch_plan
from pipeline.core.synthetic import PRESETS, seed902k_lengths

__all__ = ["read_amplification"]

# configs/dflash_902k.yaml's batching: the team's run.
TEAM_BATCHING = BatchingConfig(token_budget=262_144, round_to=8, pad_to_multiple_of=64)


def _layout(n: int, shards: int, rg_rows: int) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(file of each sample, row in its file, rows of each row group per file), as make_data."""
    bounds = np.linspace(0, n, shards + 1).round().astype(np.int64)
    ids = np.arange(n)
    fidx = np.searchsorted(bounds, ids, side="right") - 1
    rows = ids - bounds[fidx]
    sizes = np.diff(bounds)
    groups = tuple(
        tuple([rg_rows] * int(s // rg_rows) + ([int(s % rg_rows)] if s % rg_rows else []))
        for s in sizes
    )
    return fidx, rows, groups


def read_amplification(
    samples: int = PRESETS["seed902k"],
    chapters=(1, 2, 4, 8, 16),
    rg_rows=(16_384, 4_096, 1_024),
    shards: int = 32,
    seed: int = 0,
    epoch: int = 0,
) -> list[dict]:
    """One row per (row-group rows, chapters): row groups touched and bytes read per epoch."""
    lengths = seed902k_lengths(samples)
    plan = epoch_plan(
        lengths,
        TEAM_EDGES,
        epoch=epoch,
        world_size=1,
        batching=TEAM_BATCHING,
        plan=PlanConfig(seed=seed),
    )
    tokens = step_tokens(plan)
    out = []
    for g in rg_rows:
        fidx, rows, groups = _layout(samples, shards, g)
        rg = row_group_of(fidx, rows, groups)
        rg_bytes = np.bincount(rg, weights=4.0 * lengths + 8)
        planned_rg = rg[plan.sample_ids]  # sample ids are positions here
        for c in chapters:
            b = chapter_bounds(tokens, max_steps=-(-plan.num_steps // c))
            r = chapter_read_bytes(plan, b, planned_rg, rg_bytes)
            out.append(
                {
                    "rg_rows": g,
                    "chapters": r["chapters"],
                    "row_groups": r["row_groups"],
                    "min_touched_frac": min(r["touched"]) / r["row_groups"],
                    "epoch_gb": r["epoch_bytes"] / 1e9,
                    "corpus_gb": r["corpus_bytes"] / 1e9,
                    "amplification": r["amplification"],
                    "max_chapter_tokens": int(np.add.reduceat(tokens, b[:-1]).max()),
                }
            )
    return out


if __name__ == "__main__":
    import time

    t0 = time.perf_counter()
    for row in read_amplification():
        print(
            "  ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
            )
        )
    print(f"{time.perf_counter() - t0:.1f} s")
