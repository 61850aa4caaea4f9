"""Windowed epochs on the 902K preset: what windows cost in fill and shuffle, and what they save
in reads (plans only, no Ray, seconds).

    python -m bench.windows [--out benchmarks/windows.json] [--quick]

For 1 (the global plan), 4, 16 and 64 windows (fewer where a window would hold less than two row
groups), padded (the team's edges, the default token budget) and packed (one bucket, 8,192-token
rows): the steps, the fill against the global plan's, batch recomposition and repeated pairs
between epochs 0 and 1 (their chance floor beside them), the rows a window trains that the
window before it read (held from one window to the next), and the bytes read per epoch when
each chapter reads the row groups of its rows from parquet: a global plan cut into as many
chapters, and the windowed plan with its carried rows read again (what holding them saves).
Row groups are `jobs.make_data`'s (16,384 rows) and 1,024 rows.
"""

from __future__ import annotations

import time

import numpy as np

from bench.common import run_script
from bench.packing import pair_repeat
from bench.quality import repeated_pair_share
from bench.table_blocks import columns
from pipeline.core.chapters import chapter_read_bytes, plan_chapter_bounds
from pipeline.core.config import DEFAULT_TOKEN_BUDGET, TEAM_EDGES, PlanConfig, TokenBudgetBatching
from pipeline.core.frontier import recomposition_floor
from pipeline.core.metrics import batch_recomposition
from pipeline.core.packing import attention_width_for, packed_summary
from pipeline.core.plan import EpochPlan
from pipeline.core.rows import PackingSpec
from pipeline.core.synthetic import seed902k_lengths
from pipeline.core.windows import (
    MIN_ROW_GROUPS_PER_WINDOW,
    carried_rows,
    sample_windows,
    trained_windows,
    windowed_epoch_plan,
    windowed_pack_epoch,
)
from pipeline.data.corpus import ROW_GROUP_ROWS

__all__ = ["measure", "plan_pair", "table", "window_row"]

WINDOWS = (1, 4, 16, 64)
RG_ROWS = (ROW_GROUP_ROWS, 1024)
PACK = PackingSpec(row_tokens=8192, rows_per_step=16, attention_width=attention_width_for(2048))
BYTES_PER_TOKEN = 4.0  # int32 ids: what a read decodes per token, to the nearest byte


def plan_pair(lengths, rg, n: int, packed: bool, seed: int = 0) -> tuple[list[EpochPlan], float]:
    """Epochs 0 and 1 planned with `n` windows (1: the global plan), and epoch 0's seconds."""
    wt = None if n == 1 else int(lengths.sum() // n) + 1
    plans, secs = [], 0.0
    for epoch in (0, 1):
        t = time.perf_counter()
        window = sample_windows(lengths, rg, wt, seed=seed, epoch=epoch)
        if packed:
            p = windowed_pack_epoch(
                lengths, [0, 8192], window=window, seed=seed, epoch=epoch, world_size=1, spec=PACK
            )
        else:
            batching = TokenBudgetBatching(mode="token_budget", token_budget=DEFAULT_TOKEN_BUDGET)
            p = windowed_epoch_plan(
                lengths,
                TEAM_EDGES,
                window=window,
                epoch=epoch,
                world_size=1,
                batching=batching,
                plan=PlanConfig(seed=seed),
            )
        secs = secs or time.perf_counter() - t
        plans.append(p)
    return plans, secs


def _step_of(plan: EpochPlan, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.int64)
    out[plan.sample_ids] = np.repeat(np.arange(plan.num_steps), np.diff(plan.step_offsets))
    return out


def window_row(lengths, rg, n: int, packed: bool, glob: EpochPlan | None) -> dict:
    """One row of the table: `n` windows, padded or packed, against the global plan `glob`."""
    (p0, p1), secs = plan_pair(lengths, rg, n, packed)
    wt = None if n == 1 else int(lengths.sum() // n) + 1
    window = sample_windows(lengths, rg, wt, seed=0, epoch=0)
    sizes = np.bincount(rg, weights=lengths * BYTES_PER_TOKEN)
    carried = carried_rows(p0, window[p0.sample_ids])
    n_win = 1 if p0.window_steps is None else p0.window_steps.size - 1
    if packed:
        fill = packed_summary(p0)["row_fill"]
        pr = pair_repeat(_step_of(p0, lengths.size), _step_of(p1, lengths.size), 200_000)
        shuffle = {"pair_repeat": pr["rate"], "pair_chance": pr["chance"]}
    else:
        fill = p0.planned_padding_efficiency()
        _, o0 = p0.micro_batch_lengths()
        _, o1 = p1.micro_batch_lengths()
        shuffle = {
            "recomposition": batch_recomposition(p0.sample_ids, o0, p1.sample_ids, o1),
            "repeated_pairs": repeated_pair_share(p0.sample_ids, o0, p1.sample_ids, o1),
            "chance_floor": recomposition_floor(p1),
        }
    reread = {}
    if n_win > 1:
        reread = chapter_read_bytes(p0, p0.window_steps, rg[p0.sample_ids], sizes)
    base = glob or p0
    ch = plan_chapter_bounds(base, max_steps=-(-base.num_steps // n_win))
    glob_reads = chapter_read_bytes(base, ch, rg[base.sample_ids], sizes)["amplification"]
    held = [0.0]
    if n_win > 1:
        trained = trained_windows(p0)
        held = np.bincount(trained[carried], weights=p0.lengths[carried], minlength=n_win)
    return {
        "windows": n_win,
        "layout": "packed" if packed else "padded",
        "steps": p0.num_steps,
        "fill": fill,
        "fill_vs_global": fill / (glob_fill(glob, packed) if glob else fill),
        **shuffle,
        "carried_share": float(carried.mean()),
        "held_mib_max": float(np.max(held)) * BYTES_PER_TOKEN / 2**20,
        "reads_held": _reads_held(window[p0.sample_ids], rg[p0.sample_ids], sizes),
        "reads_carry_reread": reread.get("amplification", 1.0),
        "reads_global_chapters": glob_reads,
        "plan_s": secs,
    }


def _reads_held(read_window: np.ndarray, rg: np.ndarray, sizes: np.ndarray) -> float:
    """Bytes read per epoch over the corpus's when each window reads the row groups of the rows
    it reads (its own, those it carries out included) and holds the carried rows."""
    U = sizes.size
    pair = np.unique(read_window * U + rg)
    return float(sizes[pair % U].sum() / sizes.sum())


def glob_fill(glob: EpochPlan, packed: bool) -> float:
    return packed_summary(glob)["row_fill"] if packed else glob.planned_padding_efficiency()


def measure(args, log) -> dict:
    lengths = seed902k_lengths()
    if args.quick:
        lengths = lengths[:120_000]
    out = {"samples": int(lengths.size), "tokens": int(lengths.sum()), "layouts": []}
    for rows in RG_ROWS:
        rg = np.arange(lengths.size) // rows
        biggest = int(np.bincount(rg, weights=lengths).max())
        for packed in (False, True):
            glob, table = None, []
            for n in WINDOWS:
                if n > 1 and lengths.sum() / n < MIN_ROW_GROUPS_PER_WINDOW * biggest:
                    log(f"{rows}-row row groups: {n} windows would hold < 2 row groups, skipped")
                    continue
                r = window_row(lengths, rg, n, packed, glob)
                if n == 1:
                    glob = plan_pair(lengths, rg, 1, packed)[0][0]
                log(f"{rows} rows/rg {r['layout']} {r['windows']} windows: fill {r['fill']:.4f}")
                table.append(r)
            out["layouts"].append({"row_group_rows": rows, "packed": packed, "rows": table})
    return out


def table(r: dict) -> str:
    """BENCHMARKS.md's windows table: one row per row-group size, layout and window count."""
    rows = [
        x | {"rg": f"{L['row_group_rows']:,}", "shuffle": x.get("recomposition")}
        for L in r["windows"]["layouts"]
        for x in L["rows"]
    ]
    return columns(
        "rows per row group=rg | layout=layout | windows=windows | steps=steps | fill=fill:.4f"
        " | fill / global plan's=fill_vs_global:.4f | recomposition e0→e1=shuffle:.1%"
        " | its chance floor=chance_floor:.1% | repeated pairs=repeated_pairs:.3%"
        " | packed pair repeats=pair_repeat:.3% | their chance=pair_chance:.3%"
        " | rows carried=carried_share:.2% | most held MiB=held_mib_max:.2f"
        " | reads/epoch, carry held=reads_held:.2f | carry read again=reads_carry_reread:.2f"
        " | global plan in as many chapters=reads_global_chapters:.2f | plan s=plan_s:.2f",
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    run_script("bench.windows", __doc__, measure, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
