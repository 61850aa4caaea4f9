"""Contract 10: every kind of bad input stops the run naming file, sample id and reason, or is
quarantined with its reason and counted; nothing is dropped without a count."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.config import RunConfig
from pipeline.data import DataError, build_length_index, rank_batches, start_feeder
from pipeline.data.index import Reason

pytestmark = pytest.mark.ray

VOCAB = 100
EDGES = [0, 32, 64]
ROWS = 40  # per good file; sample ids 1000 * file + row


def good_rows(f: int, n: int = ROWS, seed: int = 0):
    rng = np.random.default_rng((seed, f))
    ids = np.arange(n, dtype=np.int64) + 1000 * f
    tokens = [rng.integers(0, VOCAB, int(k)).astype(np.int32) for k in rng.integers(1, 65, n)]
    return ids, tokens


def write(path, ids, tokens, *, id_type=None, **extra):
    cols = {
        "sample_id": pa.array(ids, pa.int64()),
        "input_ids": pa.array(tokens, pa.list_(id_type or pa.int32())),
    }
    cols.update(extra)
    pq.write_table(pa.table(cols), path)


def dataset(tmp_path, mutate):
    """Two good shards a.parquet and b.parquet, then `mutate(dir)` adds or breaks something."""
    d = tmp_path / "data"
    d.mkdir()
    for f, name in enumerate(("a", "b")):
        write(d / f"{name}.parquet", *good_rows(f))
    mutate(d)
    return d


def cfg_for(d, mode="error", delivery=None, **data):
    return RunConfig.model_validate(
        {
            "data": {"path": str(d), "on_bad_rows": mode, **data},
            "delivery": delivery or {},
            "buckets": {"edges": EDGES},
            "batching": {"token_budget": 256},
            "model": {"vocab_size": VOCAB},
        }
    )


def _row_case(sid, tokens, **extra):
    def mutate(d):
        write(d / "c.parquet", [sid], [np.asarray(tokens, np.int32)], **extra)

    return mutate


def _mask_mismatch(d):
    ids, tokens = good_rows(2, 5)
    masks = [np.ones(len(t), np.int8) for t in tokens]
    masks[3] = masks[3][:-1] if len(masks[3]) > 1 else np.ones(2, np.int8)
    write(d / "c.parquet", ids, tokens, loss_mask=pa.array(masks, pa.list_(pa.int8())))


def _wrong_type(d):
    pq.write_table(
        pa.table({"sample_id": pa.array([2000], pa.int64()), "input_ids": pa.array([["a", "b"]])}),
        d / "c.parquet",
    )


def _missing_column(d):
    pq.write_table(
        pa.table({"sample_id": [2000], "tokens": pa.array([[1, 2]], pa.list_(pa.int32()))}),
        d / "c.parquet",
    )


def _duplicate(d):
    ids, tokens = good_rows(2, 5)
    ids[2] = 1003  # a.parquet row 3 has sample_id 1003 too
    write(d / "c.parquet", ids, tokens)


def _truncated(d):
    ids, tokens = good_rows(2, 30)
    write(d / "c.parquet", ids, tokens)
    raw = (d / "c.parquet").read_bytes()
    (d / "c.parquet").write_bytes(raw[: len(raw) // 2])


def _not_parquet(d):
    (d / "c.parquet").write_text("sample_id,input_ids\n1,2 3 4\n")


# (case, mutation, sample id named in the message or None for whole-file problems, reason)
CASES = [
    ("empty_input_ids", _row_case(2000, []), 2000, "empty input_ids"),
    ("over_length", _row_case(2001, np.ones(70)), 2001, "length 70 exceeds the top bucket edge 64"),
    ("negative_id", _row_case(2002, [1, -3, 4]), 2002, "token id -3 < 0"),
    (
        "id_over_vocab",
        _row_case(2003, [1, VOCAB, 4]),
        2003,
        f"token id {VOCAB} >= model.vocab_size {VOCAB}",
    ),
    ("loss_mask_length", _mask_mismatch, 2003, "loss_mask length != input_ids length"),
    ("wrong_column_type", _wrong_type, None, "wrong type for input_ids: list<element: string>"),
    ("missing_column", _missing_column, None, "missing column input_ids"),
    ("duplicate_sample_id", _duplicate, 1003, "duplicate sample_id (first seen in"),
    ("truncated_file", _truncated, None, "not a readable parquet file"),
    ("non_parquet_file", _not_parquet, None, "not a readable parquet file"),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case,mutate,sid,reason", CASES, ids=IDS)
def test_contract10_error_names_file_sample_id_and_reason(
    cluster, tmp_path, case, mutate, sid, reason
):
    d = dataset(tmp_path, mutate)
    with pytest.raises(DataError) as e:
        build_length_index(cfg_for(d))
    msg = str(e.value)
    assert "c.parquet" in msg, msg
    assert reason in msg, msg
    if sid is not None:
        assert f"sample_id {sid} (row group 0, row " in msg, msg  # file, row group, sample id
    assert "data.on_bad_rows=quarantine" in msg  # the message names the way out


@pytest.mark.parametrize("case,mutate,sid,reason", CASES, ids=IDS)
def test_contract10_quarantine_writes_and_counts_bad_rows(
    cluster, tmp_path, case, mutate, sid, reason
):
    d = dataset(tmp_path, mutate)
    qpath = tmp_path / "q" / "quarantine.parquet"
    index = build_length_index(cfg_for(d, "quarantine", quarantine_path=str(qpath)))
    q = pq.read_table(qpath).to_pylist()
    assert index.num_quarantined == len(q) == 1
    (rec,) = q
    assert rec["file"].endswith("c.parquet") and reason in rec["reason"]
    assert rec["sample_id"] == sid
    # One reason code per problem: a Reason name for a row, UNUSABLE_FILE for a whole file.
    assert rec["reason_code"] == (
        "UNUSABLE_FILE" if sid is None else Reason[rec["reason_code"]].name
    )
    assert (rec["row_group"] is None) == (sid is None)
    # Every good row of a and b is kept; c contributes only its good rows.
    good = set(range(ROWS)) | set(range(1000, 1000 + ROWS))
    assert good <= set(index.sample_ids.tolist())
    if sid is not None and case != "duplicate_sample_id":
        assert sid not in set(index.sample_ids.tolist())


def test_contract10_quarantined_run_delivers_every_good_row_once(cluster, tmp_path):
    d = dataset(tmp_path, _mask_mismatch)
    cfg = cfg_for(d, "quarantine")
    index = build_length_index(cfg)
    assert index.num_quarantined == 1 and os.path.isfile(index.quarantine_path)
    name = f"q-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, EDGES, name=name, path=str(d), prefetch=False)
    got = np.concatenate(
        [
            mb.sample_ids
            for r in range(2)
            for mb in rank_batches(name, epoch=0, start_step=0, rank=r, world_size=2)
        ]
    )
    assert np.array_equal(np.sort(got), index.sample_ids)
    assert 2003 not in got and index.num_samples == 2 * ROWS + 4


def test_over_length_truncate_delivers_rows_cut_to_the_top_edge(cluster, tmp_path):
    d = dataset(tmp_path, _row_case(2001, np.arange(70) % VOCAB))
    cfg = cfg_for(d, over_length="truncate")
    index = build_length_index(cfg)
    assert index.num_quarantined == 0 and index.lengths.max() == 64
    name = f"t-{uuid.uuid4().hex[:6]}"
    start_feeder(cfg, index, EDGES, name=name, path=str(d), prefetch=False)
    for mb in rank_batches(name, epoch=0, start_step=0, rank=0, world_size=1):
        if 2001 in mb.sample_ids:
            row = int(np.flatnonzero(mb.sample_ids == 2001)[0])
            assert mb.attention_mask[row].sum() == 64
            assert mb.input_ids[row, :64].tolist() == list(range(64))
            break
    else:
        pytest.fail("sample 2001 was not delivered")


def test_contract10_config_error_without_shards(cluster, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no shards under"):
        build_length_index(cfg_for(tmp_path / "empty"))
