"""The held-out set's own rules, on the driver and without Ray (the index scan runs in-process):
its lengths are cut at the training run's top edge and counted there, a set with no next-token
target is refused, a configured evaluation that would never run is refused, and a missing held-out
source is named as eval.path / eval.split with the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import pipeline.data.index
from pipeline.core.config import ConfigError, validate
from pipeline.core.evaluation import eval_plan_for
from pipeline.data.corpus import token_table
from pipeline.data.errors import DataError
from pipeline.data.evalset import load_eval_set, rank_eval_batches
from pipeline.data.index import build_length_index
from pipeline.data.scan import _rows_to_table, scan_file
from tests.helpers import tiny_raw

MAX_LENGTH = 64
TRAIN_LONGEST = 20  # below data.max_length: the optimised top edge is 20


@pytest.fixture(autouse=True)
def _scan_in_process(monkeypatch):
    """The index's scan without Ray Data: the same per-file scan, in this process."""

    def scan_all(fs, files):
        return _rows_to_table([scan_file(p, i, fs) for i, p in enumerate(files)])

    monkeypatch.setattr(pipeline.data.index, "_scan_all", scan_all)


def _shard(path: Path, lengths, first_id: int, seed: int = 0) -> str:
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = rng.integers(3, 60, int(offsets[-1])).astype(np.int32)
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = first_id + np.arange(lengths.size)
    pq.write_table(token_table(ids, values, offsets), path)
    return str(path.parent)


def _raw(tmp_path: Path, over_length: str = "truncate", data=None, **sections) -> dict:
    train = _shard(tmp_path / "train" / "train-0.parquet", np.arange(2, TRAIN_LONGEST + 1), 0)
    data = {"path": train, "max_length": MAX_LENGTH, "over_length": over_length, **(data or {})}
    return tiny_raw(tmp_path, data=data, buckets={"num_buckets": 2}, **sections)


def _load(tmp_path: Path, held: str, over_length: str = "truncate", **ev):
    cfg = validate(_raw(tmp_path, over_length, eval={"path": held, **ev}))
    index = build_length_index(cfg, cfg.data.path)
    return cfg, index, load_eval_set(cfg, index)


def test_held_out_samples_longer_than_every_training_sample_are_cut_at_the_top_edge(tmp_path):
    # 3 held-out samples between the training data's longest (20, the optimised top edge) and
    # data.max_length (64), 1 beyond it: all 4 are cut at the edge training uses, and counted.
    held = _shard(tmp_path / "held" / "h.parquet", [5, 10, 30, 40, 50, 90], 10**6, seed=1)
    cfg, index, got = _load(tmp_path, held)
    assert int(index.lengths.max()) == TRAIN_LONGEST
    assert got.lengths.max() == TRAIN_LONGEST
    assert got.truncated == 4 and "4 truncated at the top edge" in got.describe()
    rows = got.table["input_ids"].to_pylist()
    assert [len(r) for r in rows] == got.lengths.tolist()  # the rows are cut, not only counted
    # Every rank plans and collates them at the training top edge (it raised ValueError before).
    for packed in (False, True):
        c = cfg
        if packed:
            batching = {"mode": "packed", "row_tokens": 64, "rows_per_step": 2}
            c = validate(_raw(tmp_path, eval={"path": held}, batching=batching))
        for rank in range(2):
            batches = rank_eval_batches(c, got, top=TRAIN_LONGEST, rank=rank, world_size=2)
            assert sum(1 for _ in batches()) >= 0
        plan = eval_plan_for(
            c, got.lengths, got.sample_ids, top=TRAIN_LONGEST, world_size=2, packing=None
        )
        assert plan is not None


def test_with_over_length_error_a_held_out_sample_over_the_top_edge_is_refused(tmp_path):
    held = _shard(tmp_path / "held" / "h.parquet", [5, 30], 10**6, seed=1)
    with pytest.raises(
        DataError, match=r"(?s)eval.path=.*length 30 exceeds the top bucket edge 20"
    ):
        _load(tmp_path, held, over_length="error")


def test_a_held_out_set_with_no_next_token_target_is_refused(tmp_path):
    held = _shard(tmp_path / "held" / "h.parquet", [1, 1, 1], 10**6, seed=1)
    with pytest.raises(DataError) as e:
        _load(tmp_path, held)
    msg = str(e.value)
    assert "\n" not in msg and f"eval.path={held}" in msg
    assert "no next-token target" in msg and "at least 2 tokens" in msg
    # One sample with a target is enough: the others are evaluated as 0 targets.
    ok = _shard(tmp_path / "held2" / "h.parquet", [1, 1, 3], 10**6, seed=1)
    assert _load(tmp_path, ok)[2].num_samples == 3


def test_a_missing_or_empty_eval_path_names_eval_path_and_the_fix(tmp_path):
    for where in (tmp_path / "nowhere", tmp_path / "empty"):
        if where.name == "empty":
            where.mkdir()
        with pytest.raises(DataError) as e:
            _load(tmp_path, str(where))
        msg = str(e.value)
        assert "(data.path)" not in msg and "data.path" not in msg, msg
        assert "eval.path" in msg and "jobs.tokenize" in msg, msg


def test_an_eval_split_without_its_files_names_eval_split_and_the_fix(tmp_path):
    cfg = validate(_raw(tmp_path, eval={"split": "validation"}, data={"split": "train"}))
    index = build_length_index(cfg, cfg.data.path)
    with pytest.raises(DataError) as e:
        load_eval_set(cfg, index)
    msg = str(e.value)
    assert "(data.split)" not in msg and "eval.split='validation'" in msg, msg
    assert "--heldout" in msg and "eval.path" in msg, msg


def test_eval_split_beside_a_tokenized_folder_reads_train_for_training(tmp_path):
    # jobs.tokenize --heldout writes train-*.parquet and validation-*.parquet side by side: the
    # demo config (eval.split: validation, no data.split) trains on `train`, evaluates the rest.
    d = tmp_path / "mine"
    _shard(d / "train-00000.parquet", np.arange(2, 20), 0)
    _shard(d / "validation-00001.parquet", [4, 6, 8], 10**6, seed=3)
    raw = tiny_raw(tmp_path, data={"path": str(d), "max_length": 64}, eval={"split": "validation"})
    cfg = validate(raw)
    index = build_length_index(cfg, cfg.data.path)
    assert index.num_samples == 18
    assert load_eval_set(cfg, index).num_samples == 3


def test_an_evaluation_that_would_never_run_is_refused(tmp_path):
    never = {"path": "x", "every_steps": 1000, "at_start": False}
    never |= {"at_epoch_end": False, "at_end": False}
    with pytest.raises(ConfigError, match="no evaluation would ever run"):
        validate(tiny_raw(tmp_path, train={"max_steps": 30}, eval=never))
    # Known only on the driver for an epochs-based run: the run's planned steps decide.
    cfg = validate(tiny_raw(tmp_path, eval=never))
    with pytest.raises(ConfigError, match=r"eval.every_steps=1000.*30 global steps"):
        cfg.eval.check_reaches(30)
    cfg.eval.check_reaches(1000)  # the last step evaluates
    ok = validate(tiny_raw(tmp_path, train={"max_steps": 30}, eval={**never, "every_steps": 10}))
    ok.eval.check_reaches(30)
