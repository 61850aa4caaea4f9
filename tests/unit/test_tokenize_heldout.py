"""jobs.tokenize without Ray: sample ids that cannot collide across separately tokenized
folders, the held-out split chosen by source file, and progress lines a log file reads well."""

from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
import pytest

from pipeline.data.tokenize_io import TokenizeError
from pipeline.data.tokenize_split import Progress, heldout_files_of
from pipeline.data.tokenize_text import TokenizeFiles

tokenizers = pytest.importorskip("tokenizers")


def _tokenizer(path) -> str:
    from tokenizers import models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "fox", "dog", "runs"])}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return str(path)


def test_the_same_file_name_in_two_tokenized_folders_gets_different_ids(tmp_path):
    tok = _tokenizer(tmp_path / "tok.json")
    lines = "\n".join(json.dumps({"text": t}) for t in ["the fox", "the dog runs"]) + "\n"
    ids = []
    for name in ("train", "heldout"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "lines.jsonl").write_text(lines)
        (tmp_path / f"out-{name}").mkdir()
        files = TokenizeFiles(
            tok, str(tmp_path / name), str(tmp_path / f"out-{name}"), "text", True
        )
        files._one(0, "lines.jsonl")
        t = pq.read_table(tmp_path / f"out-{name}" / "shard-00000.parquet")
        ids.append(set(t["sample_id"].to_pylist()))
    assert len(ids[0]) == 2 and not ids[0] & ids[1]
    # Re-tokenizing the same folder gives the same ids.
    again = TokenizeFiles(tok, str(tmp_path / "train"), str(tmp_path / "again"), "text", True)
    (tmp_path / "again").mkdir()
    again._one(0, "lines.jsonl")
    assert (
        set(pq.read_table(tmp_path / "again" / "shard-00000.parquet")["sample_id"].to_pylist())
        == ids[0]
    )


def test_the_held_out_split_is_whole_source_files_stable_and_never_empty():
    files = [f"part-{i:03d}.jsonl" for i in range(100)]
    held = heldout_files_of(files, 0.1)
    assert len(held) == 10 and held <= set(files)
    assert heldout_files_of(list(reversed(files)), 0.1) == held  # by path, not by order
    more = heldout_files_of(files + [f"new-{i}.jsonl" for i in range(10)], 0.1)
    assert len(more) == 11 and len(more & held) >= 9  # adding files moves few
    # Few files: at least one held out, at least one trained on.
    for n in (2, 3):
        few = [f"f{i}.txt" for i in range(n)]
        for fraction in (0.01, 0.5, 0.99):
            h = heldout_files_of(few, fraction)
            assert 1 <= len(h) <= n - 1
    with pytest.raises(TokenizeError, match=r"--heldout.*whole source files.*1 input file"):
        heldout_files_of(["only.jsonl"], 0.1)


def test_progress_is_whole_lines_at_most_every_interval_and_at_the_end():
    out, now = io.StringIO(), [0.0]
    p = Progress(total=5, stream=out, interval_s=10.0, clock=lambda: now[0])
    for _ in range(5):
        now[0] += 4.0
        p.update(samples=10, tokens=100)
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) == 2  # at 12 s and at the last file
    assert lines[-1].startswith("tokenize: 5/5 files, 50 samples, 500 tokens")
