"""What the feeder's parts hand over: typed statistics of a prepared range (control values read
as fields, telemetry as the same flat record as before), and a part answering another request
than the one asked refused even under `python -O`."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pipeline.data.prepare import RangeKey, RangeStats, ReadStats

KEYS = [
    "epoch", "world_size", "start_step", "end_step", "epoch_steps", "chapter", "chapters",
    "bytes", "steps", "rows_sorted", "row_groups_read", "tokens", "in_feeder", "rg_cached",
    "rg_filled", "rg_parquet", "read_s", "gather_s", "plan_s", "sort_s", "split_s", "plan_hash",
    "done_at", "read_retries", "rows_held", "rows_carried_out", "bytes_placed", "placed_from",
    "place_s",
]  # fmt: skip


def _stats(**kw) -> RangeStats:
    base = dict(
        epoch=1, world_size=2, start_step=4, end_step=9, epoch_steps=20, chapter=0, chapters=2,
        bytes=1234, steps=5, rows_sorted=40, row_groups_read=3, tokens=900, in_feeder=True,
        reads=ReadStats(rg_cached=1, rg_filled=2, read_s=0.5, gather_s=0.25, read_retries=7),
        plan_s=0.1, sort_s=0.2, split_s=0.3, plan_hash="h", done_at=12.0,
    )  # fmt: skip
    return RangeStats(**(base | kw))


def test_range_stats_publish_the_flat_telemetry_record_in_its_order():
    d = _stats(read_retries=3).as_dict()
    assert list(d) == KEYS
    assert d["rg_cached"] == 1 and d["rg_filled"] == 2 and d["rg_parquet"] == 0
    assert d["read_s"] == 0.5 and d["gather_s"] == 0.25
    # the feeder's count of every retry of the range, not the local read's share
    assert d["read_retries"] == 3 and d["bytes"] == 1234 and d["end_step"] == 9


def test_range_stats_are_frozen_and_a_range_key_is_its_tuple():
    s = _stats()
    with pytest.raises(AttributeError):
        s.bytes = 0  # type: ignore[misc]
    key = RangeKey(1, 2, 4, 9)
    assert key == (1, 2, 4, 9) and hash(key) == hash((1, 2, 4, 9)) and key.end_step == 9


def test_a_part_for_another_request_is_refused_under_python_O():
    code = textwrap.dedent(
        """
        import numpy as np
        from pipeline.core.config import BatchingConfig
        from pipeline.core.plan import epoch_plan
        from pipeline.data.protocol import RankPart, WrongPartError
        assert False, "asserts are on: this check needs python -O"
        """
    )
    # the assert above must be gone: prove the interpreter runs with -O
    subprocess.run([sys.executable, "-O", "-c", code], check=True)
    code += textwrap.dedent(
        """
        plan = epoch_plan(np.full(40, 16), [0, 32], epoch=0, world_size=2,
                          batching=BatchingConfig(token_budget=128))
        part = RankPart(epoch=0, world_size=2, start_step=0, rank=0, prep_id="p",
                        plan_hash=plan.content_hash, view=plan.rank_view(0), refs=(),
                        edges=(0, 32), pad_id=0, pad_to_multiple_of=8, supervision="",
                        end_step=plan.num_steps, epoch_steps=plan.num_steps)
        part.check(epoch=0, world_size=2, start_step=0, rank=0)  # its own request: fine
        try:
            part.check(epoch=0, world_size=2, start_step=0, rank=1)
        except WrongPartError as e:
            print("refused:", e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("refused: feeder answered (0, 2, 0, 0, 0) to the request (0, 2, 0, 1, 1)")
