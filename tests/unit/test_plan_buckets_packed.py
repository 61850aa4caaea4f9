"""jobs.plan_buckets for packed rows: --row-tokens adds the packed epoch to the report (text and
JSON), --dump-plan writes its rows with each sample's row, and bad packed flags are one line: the
config module's refusal of the run config they make."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from jobs.plan_buckets import main
from pipeline.core.packing import PackingSpec, pack_epoch, packed_summary


def _run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_packed_report_and_dump_are_the_packed_epoch(tmp_path, capsys):
    lengths = np.random.default_rng(0).integers(1, 513, 2000)
    np.save(tmp_path / "l.npy", lengths)
    argv = ["--lengths-npy", tmp_path / "l.npy", "--max-length", 512, "--world-size", 2]
    argv += ["--row-tokens", 1024, "--rows-per-step", 4, "--attention-width", 96]
    argv += ["--json", tmp_path / "r.json", "--dump-plan", tmp_path / "p.parquet"]
    rc, out, _ = _run(argv, capsys)
    assert rc == 0
    want = pack_epoch(
        lengths,
        [0, int(lengths.max())],  # auto: one bucket, a full shuffle, as a packed run plans it
        seed=0,
        epoch=0,
        world_size=2,
        spec=PackingSpec(row_tokens=1024, rows_per_step=4, attention_width=96),
    )
    s = json.loads((tmp_path / "r.json").read_text())["packed"]
    num_rows = want.rows.num_rows
    assert (s["rows"], s["steps"], s["hash"]) == (num_rows, want.num_steps, want.content_hash)
    assert s["row_fill"] == pytest.approx(packed_summary(want)["row_fill"])
    assert f"packed rows: {num_rows:,} rows in {want.num_steps:,} steps" in out
    t = pq.read_table(tmp_path / "p.parquet").to_pydict()
    real = np.asarray(t["sample_id"]) >= 0
    np.testing.assert_array_equal(np.asarray(t["sample_id"])[real], want.sample_ids)
    rows = np.asarray(t["row"])[real]
    np.testing.assert_array_equal(np.bincount(rows), np.diff(want.rows.row_offsets))


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--row-tokens", 1020], "batching.row_tokens=1020 is not a multiple of batching.pad_to"),
        (["--row-tokens", 256], "batching.row_tokens=256 is below data.max_length=512"),
        (["--row-tokens", 1024, "--rows-per-step", 3, "--world-size", 2], "the world size 2"),
    ],
)
def test_packed_flag_errors_are_one_line_with_the_fix(tmp_path, capsys, flags, needle):
    lengths = np.random.default_rng(0).integers(1, 513, 300)
    np.save(tmp_path / "l.npy", lengths)
    rc, _, err = _run(["--lengths-npy", tmp_path / "l.npy", "--max-length", 512, *flags], capsys)
    lines = [ln for ln in err.splitlines() if not ln.startswith("[plan_buckets]")]
    assert rc == 2 and len(lines) == 1 and needle in lines[0], err
