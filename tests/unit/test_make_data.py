"""jobs.make_data: deterministic, idempotent synthetic shards with the documented schema."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.make_data import main
from pipeline.core.synthetic import seed902k_lengths
from pipeline.data.corpus import MARKER


def _read(d):
    return pa.concat_tables([pq.read_table(p) for p in sorted(d.glob("shard-*.parquet"))])


def test_make_data_writes_the_preset_lengths_deterministically(tmp_path):
    s = main(
        [
            "--out",
            str(tmp_path / "a"),
            "--num-samples",
            "500",
            "--shards",
            "3",
            "--vocab-size",
            "64",
        ]
    )
    assert s["samples"] == 500 and s["files"] == 3 and (tmp_path / "a" / MARKER).is_file()
    t = _read(tmp_path / "a")
    assert t.schema.field("input_ids").type == pa.list_(pa.int32())
    assert t["sample_id"].to_pylist() == list(range(500))
    lengths = np.array([len(x) for x in t["input_ids"].to_pylist()])
    assert np.array_equal(lengths, seed902k_lengths(500, seed=0))
    flat = np.concatenate(t["input_ids"].to_numpy(zero_copy_only=False))
    assert flat.min() >= 0 and flat.max() < 64
    main(
        [
            "--out",
            str(tmp_path / "b"),
            "--num-samples",
            "500",
            "--shards",
            "3",
            "--vocab-size",
            "64",
        ]
    )
    assert _read(tmp_path / "b").equals(t)


def test_make_data_is_idempotent_and_refuses_foreign_dirs(tmp_path, capsys):
    args = ["--out", str(tmp_path / "a"), "--num-samples", "50", "--shards", "2"]
    main(args)
    assert main(args)["skipped"]
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "x"), "--num-samples", "10"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress lines
    assert err.startswith("python -m jobs.make_data: error: ") and "choose an empty --out" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--num-samples", "-5"], "argument --num-samples: must be >= 1, got -5"),
        (["--shards", "0"], "argument --shards: must be >= 1, got 0"),
        (["--vocab-size", "1"], "argument --vocab-size: must be >= 2, got 1"),
        (["--corpus-seed", "-1"], "argument --corpus-seed: must be >= 0, got -1"),
        (["--seed", "1"], "unrecognized arguments: --seed"),  # the corpus seed has one name
    ],
)
def test_make_data_refuses_bad_counts_without_a_traceback(tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "a"), *argv])
    assert e.value.code == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_make_data_help_runs():
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0


def test_a_held_out_split_of_the_synthetic_corpus_shares_no_id_and_no_tokens(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq

    from pipeline.data.corpus import write_corpus

    write_corpus(tmp_path, num_samples=300, shards=2, vocab_size=64, heldout=0.1, progress=False)
    names = sorted(p.name for p in tmp_path.glob("*.parquet"))
    assert names == ["train-00000.parquet", "train-00001.parquet", "validation-00000.parquet"]
    train = [pq.read_table(tmp_path / n) for n in names[:2]]
    held = pq.read_table(tmp_path / names[2])
    train_ids = np.concatenate([t["sample_id"].to_numpy() for t in train])
    assert train_ids.size == 300 and held.num_rows == 30
    assert not set(held["sample_id"].to_pylist()) & set(train_ids.tolist())
    seen = {tuple(x) for t in train for x in t["input_ids"].to_pylist()}
    assert not any(tuple(x) in seen for x in held["input_ids"].to_pylist())
