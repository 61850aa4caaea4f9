"""jobs.tokenize's inputs, without Ray: every file used or listed as skipped with its reason,
empty documents counted as empty, one-line refusals naming the file."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from pipeline.data.tokenize import tokenize_dataset
from pipeline.data.tokenize_io import TokenizeError, list_inputs, skipped_inputs
from pipeline.data.tokenize_text import TokenizeFiles

tokenizers = pytest.importorskip("tokenizers")


def _tokenizer(path) -> str:
    """A word-level tokenizer that adds [BOS] ... [EOS], as most pretrained ones do."""
    from tokenizers import models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(["[UNK]", "[BOS]", "[EOS]", "the", "fox", "dog"])}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A [EOS]", special_tokens=[("[BOS]", 1), ("[EOS]", 2)]
    )
    tok.save(str(path))
    return str(path)


def test_every_input_file_is_used_or_listed_as_skipped_with_its_reason(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.jsonl", "b.txt", "sub/c.parquet", "d.jsonl.gz", "notes.md", "_x.jsonl"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    (tmp_path / ".git" / "config").write_text("x")
    fs, root = pafs.LocalFileSystem(), str(tmp_path)
    used = list_inputs(fs, root)
    skipped = dict(skipped_inputs(fs, root))
    assert used == ["a.jsonl", "b.txt", "sub/c.parquet"]
    assert sorted(skipped) == [".git/", "_x.jsonl", "d.jsonl.gz", "notes.md"]  # .git/ once
    assert "decompress" in skipped["d.jsonl.gz"] and "(.md)" in skipped["notes.md"]
    assert "hidden" in skipped["_x.jsonl"]


def _one(tmp_path, rel: str, data: bytes) -> dict:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "in" / rel).write_bytes(data)
    tok = _tokenizer(tmp_path / "tok.json")
    return TokenizeFiles(tok, str(tmp_path / "in"), str(tmp_path / "out"), "text", True)._one(
        0, rel
    )


def test_empty_documents_are_counted_empty_not_bos_eos_samples(tmp_path):
    lines = [{"text": ""}, {"text": "the fox"}, {"text": "   "}, {"text": "dog"}]
    got = _one(tmp_path, "a.jsonl", "\n".join(json.dumps(x) for x in lines).encode())
    assert got["empty"] == 2 and got["lengths"] == [4, 3]  # [BOS] the fox [EOS], [BOS] dog [EOS]
    assert [p[1:3] for p in json.loads(got["problems"])] == [[0, "empty"], [2, "empty"]]
    assert _one(tmp_path, "e.txt", b"\n")["empty"] == 1  # an empty .txt document


def test_a_json_array_file_is_refused_with_the_json_lines_hint(tmp_path):
    got = _one(tmp_path, "docs.json", json.dumps([{"text": "the fox"}] * 11).encode())
    assert got["error"].startswith("docs.json: holds one JSON array")
    assert "JSON Lines" in got["error"] and "jq -c" in got["error"] and got["undecodable"] == 0


def test_a_corrupt_parquet_input_is_named_in_one_line(tmp_path):
    pq.write_table(pa.table({"text": ["the fox"] * 50}), tmp_path / "good.parquet")
    data = (tmp_path / "good.parquet").read_bytes()
    got = _one(tmp_path, "bad.parquet", data[: len(data) // 2])
    assert got["error"].startswith("bad.parquet: not a readable parquet file")
    assert "\n" not in got["error"]


def test_out_inside_input_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"text": "the fox"}) + "\n")
    tok = _tokenizer(tmp_path / "tok.json")
    with pytest.raises(TokenizeError, match="--out .*/in/tok is inside --input"):
        tokenize_dataset(str(tmp_path / "in"), tok, str(tmp_path / "in" / "tok"))
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == ["a.jsonl"]
