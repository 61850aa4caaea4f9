"""The real-text corpus: stdlib source split at definitions, byte tokens, stable ids, manifest."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.make_text import main
from pipeline.data.textcorpus import (
    BOS_ID,
    EOS_ID,
    MANIFEST,
    TEXT_MARKER,
    byte_tokens,
    split_source,
    stable_id,
    text_corpus_is_current,
    write_text_corpus,
)

SRC = textwrap.dedent(
    '''\
    """doc"""
    import os


    @decorator
    def top(a):
        return a


    class K(Base):
        """K doc."""

        X = 1

        def m(self):
            pass

        @property
        def p(self):
            return 2
    '''
)


def _tree(root, files):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def _read(d):
    return pa.concat_tables([pq.read_table(p) for p in sorted(d.glob("shard-*.parquet"))])


def test_split_source_takes_functions_methods_and_class_headers():
    got = [(s.kind, s.name, s.start, s.end) for s in split_source(SRC, "m.py")]
    assert got == [
        ("function", "top", 5, 7),  # the decorator line is part of the sample
        ("class", "K", 10, 14),  # header: class line .. the line before the first method
        ("method", "K.m", 15, 16),
        ("method", "K.p", 18, 20),
    ]


def test_byte_tokens_wrap_utf8_bytes_in_bos_eos():
    values, offsets = byte_tokens(["ab", "é"])
    assert offsets.tolist() == [0, 4, 8]
    assert values.tolist() == [BOS_ID, 97 + 3, 98 + 3, EOS_ID, BOS_ID, 0xC3 + 3, 0xA9 + 3, EOS_ID]
    assert values.dtype == np.int32


def test_corpus_layout_manifest_ids_and_skips(tmp_path):
    root = _tree(
        tmp_path / "lib",
        {
            "m.py": SRC,
            "pkg/n.py": "def f():\n    return 1\n",
            "test/t.py": "def in_a_test_dir():\n    pass\n",
            "bad.py": "def broken(:\n",
        },
    )
    s = main(["--out", str(tmp_path / "out"), "--root", str(root), "--shards", "2"])
    out = tmp_path / "out"
    assert s["samples"] == 5 and s["files_skipped"] == 1 and s["vocab_size"] == 259
    t = _read(out)
    assert t.schema.field("input_ids").type == pa.list_(pa.int32())
    man = pq.read_table(out / MANIFEST).to_pylist()
    assert [(r["file"], r["start_line"], r["end_line"]) for r in man] == [
        ("m.py", 5, 7),
        ("m.py", 10, 14),
        ("m.py", 15, 16),
        ("m.py", 18, 20),
        ("pkg/n.py", 1, 2),
    ]
    assert t["sample_id"].to_pylist() == [r["sample_id"] for r in man]
    assert t["sample_id"].to_pylist()[-1] == stable_id("pkg/n.py", 1)
    # The sample decodes back to its source lines.
    ids = np.asarray(t["input_ids"].to_pylist()[-1])
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert bytes((ids[1:-1] - 3).astype(np.uint8)).decode() == "def f():\n    return 1\n"
    marker = json.loads((out / TEXT_MARKER).read_text())
    assert marker["python"].count(".") == 2 and marker["files_skipped"] == ["bad.py"]


def test_ids_are_stable_when_other_files_change_and_rebuild_is_a_noop(tmp_path):
    root = _tree(tmp_path / "lib", {"a.py": "def f():\n    pass\n", "b.py": SRC})
    first = write_text_corpus(tmp_path / "o", root=str(root), progress=False)
    ids_b = set(pq.read_table(tmp_path / "o" / MANIFEST)["sample_id"].to_pylist())
    assert write_text_corpus(tmp_path / "o", root=str(root), progress=False)["skipped"]
    assert text_corpus_is_current(tmp_path / "o", root=str(root))
    (root / "a.py").write_text("def g():\n    pass\n\n\ndef h():\n    pass\n")
    write_text_corpus(tmp_path / "o2", root=str(root), progress=False)
    ids_b2 = set(pq.read_table(tmp_path / "o2" / MANIFEST)["sample_id"].to_pylist())
    b_ids = {stable_id("b.py", n) for n in (5, 10, 15, 18)}
    assert b_ids <= ids_b and b_ids <= ids_b2 and first["samples"] == 5


def test_refuses_foreign_dirs_and_unknown_presets(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    root = _tree(tmp_path / "lib", {"a.py": "def f():\n    pass\n"})
    with pytest.raises(FileExistsError, match="notes.txt"):
        write_text_corpus(tmp_path / "x", root=str(root), progress=False)
    with pytest.raises(ValueError, match="pystdlib"):
        write_text_corpus(tmp_path / "y", preset="nope", progress=False)


def test_optional_tokenizer_json_encodes_the_text(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        ["def f ( ) : pass"], trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    root = _tree(tmp_path / "lib", {"a.py": "def f():\n    pass\n"})
    s = write_text_corpus(
        tmp_path / "o", root=str(root), tokenizer=str(tmp_path / "tokenizer.json"), progress=False
    )
    ids = _read(tmp_path / "o")["input_ids"].to_pylist()[0]
    assert ids == tok.encode("def f():\n    pass\n").ids and s["vocab_size"] == tok.get_vocab_size()


def test_the_stdlib_corpus_builds(tmp_path):
    s = write_text_corpus(tmp_path / "std", progress=False)
    assert s["samples"] > 5_000 and len(s["files_skipped"]) < 10
    man = pq.read_table(tmp_path / "std" / MANIFEST)
    assert not any(f.startswith(("test/", "idlelib/idle_test/")) for f in man["file"].to_pylist())
    assert man.num_rows == s["samples"] == _read(tmp_path / "std").num_rows


def test_the_pipeline_builds_the_text_preset_on_first_use(tmp_path):
    from pipeline.core.config import validate
    from pipeline.data.index import resolve_data_path

    out = tmp_path / "pystdlib"
    cfg = validate({"data": {"synthetic": {"preset": "pystdlib", "out_dir": str(out)}}})
    assert resolve_data_path(cfg) == str(out)
    syn = cfg.data.synthetic
    assert text_corpus_is_current(
        out, shards=syn.shards, max_samples=syn.num_samples, seed=syn.seed
    )
    assert (out / MANIFEST).is_file() and len(list(out.glob("shard-*.parquet"))) == 4


def test_num_samples_and_seed_draw_a_subset_in_source_order(tmp_path):
    """pystdlib's num_samples and seed are not inert: a seeded subset, spread over the library."""
    files = {
        f"m{i:02d}.py": "".join(f"def f{j}():\n    return {j}\n\n\n" for j in range(5))
        for i in range(8)
    }
    root = _tree(tmp_path / "lib", files)

    def ids(out, **kw):
        s = write_text_corpus(tmp_path / out, root=str(root), progress=False, **kw)
        return s, pq.read_table(tmp_path / out / MANIFEST).to_pylist()

    full, rows = ids("all")
    assert full["samples"] == full["definitions_found"] == 40
    part, sub = ids("sub", max_samples=12, seed=3)
    assert part["samples"] == 12 and part["definitions_found"] == 40
    order = [r["sample_id"] for r in rows]
    picked = [order.index(r["sample_id"]) for r in sub]
    assert picked == sorted(picked) and len({r["file"] for r in sub}) > 3  # spread, in order
    assert [r["sample_id"] for r in ids("again", max_samples=12, seed=3)[1]] == [
        r["sample_id"] for r in sub
    ]
    other = [r["sample_id"] for r in ids("other", max_samples=12, seed=4)[1]]
    assert other != [r["sample_id"] for r in sub]
    assert not text_corpus_is_current(tmp_path / "sub", root=str(root), max_samples=13, seed=3)
    assert text_corpus_is_current(tmp_path / "sub", root=str(root), max_samples=12, seed=3)


def test_plan_buckets_data_without_a_config_accepts_any_vocab_and_length(tmp_path, monkeypatch):
    """Real tokenized data (a 50K vocabulary, functions over 8192 tokens) needs no run config."""
    import sys
    import types

    from jobs.plan_buckets import main as plan_main

    seen = []

    def build_length_index(cfg, path):
        seen.append((cfg.model.vocab_size, cfg.data.max_length))
        return types.SimpleNamespace(sample_ids=np.arange(300), lengths=np.arange(1, 301) * 60)

    fake = types.ModuleType("pipeline.data")
    fake.build_length_index, fake.DataError = build_length_index, ValueError
    monkeypatch.setitem(sys.modules, "pipeline.data", fake)  # no Ray in unit tests
    args = ["--data", str(tmp_path), "--batch-size", "8", "--num-buckets", "3"]
    assert plan_main(args) == 0
    assert seen[-1][0] >= 50_000 and seen[-1][1] >= 18_000
    (tmp_path / "c.yaml").write_text("model: {vocab_size: 300}\ndata: {max_length: 20000}\n")
    assert plan_main([*args, "--config", str(tmp_path / "c.yaml")]) == 0
    assert seen[-1] == (300, 20000)
