"""Your own text: jobs.tokenize (Ray Data map_batches, local tokenizer.json, stable ids, every
skipped document counted), then the newcomer's three commands -- tokenize, train a Hugging Face
causal LM on bucketed batches, export it -- end to end."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from jobs.tokenize import main as tokenize_main
from pipeline.data.textcorpus import stable_id

pytestmark = pytest.mark.ray
tokenizers = pytest.importorskip("tokenizers")

WORDS = "the quick brown fox jumps over the lazy dog and runs far away from home".split()


def _tokenizer(path) -> tokenizers.Tokenizer:
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[PAD]", "[UNK]"])
    tok.train_from_iterator([" ".join(WORDS)] * 50, trainer)
    tok.save(str(path))
    return tok


def _docs(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 40)))) for _ in range(n)]


def _read(d) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted(d.glob("shard-*.parquet"))])


def test_tokenize_counts_every_skipped_document_and_keeps_ids_stable(cluster, tmp_path):
    tok = _tokenizer(tmp_path / "tokenizer.json")
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    lines = [json.dumps({"text": "the quick fox"}), "", "{not json", json.dumps({"body": "x"})]
    lines += [json.dumps({"text": 7}), json.dumps({"text": "lazy dog"})]
    (src / "a.jsonl").write_text("\n".join(lines) + "\n")
    pq.write_table(pa.table({"text": ["runs far", None, ""]}), src / "sub" / "b.parquet")
    (src / "c.txt").write_text("brown fox\njumps over")
    (src / "d.txt").write_bytes(b"\xff\xfe broken")
    (src / "_hidden.jsonl").write_text(json.dumps({"text": "never read"}) + "\n")
    (src / "notes.md").write_text("not an input")

    png = tmp_path / "lengths.png"
    s = tokenize_main(
        ["--input", str(src), "--tokenizer", str(tmp_path / "tokenizer.json")]
        + ["--out", str(tmp_path / "out"), "--png", str(png)]
    )
    assert s["files"] == 4 and s["samples"] == 4 and s["vocab_size"] == tok.get_vocab_size()
    # every input file not read is listed with its reason
    assert [p for p, _ in s["skipped"]] == ["_hidden.jsonl", "notes.md"]
    # empty: the blank line, the null and the "" parquet rows; undecodable: bad JSON, missing
    # field, a number, a non-UTF-8 .txt file.
    assert (s["empty"], s["undecodable"]) == (3, 4)
    assert sorted((p[0], p[1], p[2]) for p in s["problems"]) == [
        ("a.jsonl", 1, "empty"),
        ("a.jsonl", 2, "undecodable"),
        ("a.jsonl", 3, "undecodable"),
        ("a.jsonl", 4, "undecodable"),
        ("d.txt", 0, "undecodable"),
        ("sub/b.parquet", 1, "empty"),
        ("sub/b.parquet", 2, "empty"),
    ]
    t = _read(tmp_path / "out")
    assert t.schema.field("input_ids").type == pa.list_(pa.int32())
    got = dict(zip(t["sample_id"].to_pylist(), t["input_ids"].to_pylist(), strict=True))
    for rel, row, text in [
        ("a.jsonl", 0, "the quick fox"),
        ("a.jsonl", 5, "lazy dog"),
        ("sub/b.parquet", 0, "runs far"),
        ("c.txt", 0, "brown fox\njumps over"),
    ]:
        assert got[stable_id(str(src), rel, row)] == tok.encode(text).ids  # root, path, row
    assert png.stat().st_size > 1000
    assert json.loads((tmp_path / "out" / "_bucketray_tokenize.json").read_text())["samples"] == 4

    # Re-tokenizing gives the same ids even with a new file added; the summary counts it.
    (src / "e.jsonl").write_text(json.dumps({"text": "far away"}) + "\n")
    s2 = tokenize_main(
        ["--input", str(src), "--tokenizer", str(tmp_path / "tokenizer.json")]
        + ["--out", str(tmp_path / "out")]
    )
    t = _read(tmp_path / "out")
    t2 = dict(zip(t["sample_id"].to_pylist(), t["input_ids"].to_pylist(), strict=True))
    assert s2["samples"] == 5 and {k: t2[k] for k in got} == got


def test_heldout_writes_a_validation_split_by_source_file_with_a_clean_console(
    cluster, tmp_path, capfd
):
    """--heldout: whole files held out as split validation beside split train (what the demo
    config's eval.split: validation reads), held-out documents repeating a training document's
    tokens dropped and counted, and a console of whole lines without Ray's logging."""
    _tokenizer(tmp_path / "tokenizer.json")
    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(10):
        docs = _docs(20, seed=i) + ["the lazy dog"]  # one document in every file
        (src / f"part{i}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    capfd.readouterr()
    s = tokenize_main(
        ["--input", str(src), "--tokenizer", str(tmp_path / "tokenizer.json")]
        + ["--out", str(tmp_path / "mine"), "--heldout", "0.2"]
    )
    out, err = capfd.readouterr()
    held = s["heldout_files"]
    assert len(held) == 2 and s["heldout_duplicates_dropped"] == len(held)
    assert s["heldout_samples"] == 20 * len(held) and s["train_samples"] == 21 * (10 - len(held))
    train, val = (
        _read_split(tmp_path / "mine", "train"),
        _read_split(tmp_path / "mine", "validation"),
    )
    assert train.num_rows == s["train_samples"] and val.num_rows == s["heldout_samples"]
    assert not set(train["sample_id"].to_pylist()) & set(val["sample_id"].to_pylist())
    assert not set(map(tuple, val["input_ids"].to_pylist())) & set(
        map(tuple, train["input_ids"].to_pylist())
    )
    # The console: whole lines, no Ray logging (INFO lines, core_worker errors), no \r.
    assert "\r" not in err and "INFO" not in err and "core_worker" not in err, err
    assert "Deprecat" not in err and "logging_progress" not in err, err
    assert err.strip().splitlines()[-1].startswith("tokenize: 10/10 files"), err
    assert "split validation" in out and "eval.split: validation" in out


def _read_split(d, split: str) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted(d.glob(f"{split}-*.parquet"))])


def test_tokenize_user_errors_are_one_line(cluster, tmp_path, capsys):
    _tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "in" / "a.parquet")
    args = ["--input", str(tmp_path / "in"), "--tokenizer", str(tmp_path / "tokenizer.json")]
    with pytest.raises(SystemExit) as e:
        tokenize_main([*args, "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "a.parquet: no column 'text'" in err and "--text-column" in err
    # The fix works into the same output directory.
    s = tokenize_main([*args, "--out", str(tmp_path / "o"), "--text-column", "content"])
    assert s["samples"] == 1
    with pytest.raises(SystemExit):
        tokenize_main(
            ["--input", str(tmp_path / "in"), "--tokenizer", "/nope.json"] + ["--out", "x"]
        )
    assert "cannot load tokenizer /nope.json" in capsys.readouterr().err


@pytest.mark.slow
def test_three_commands_from_jsonl_to_a_trained_hugging_face_model(cluster, tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    from jobs.export_hf import main as export_main
    from jobs.train import main as train_main
    from pipeline.learn.checkpoint import load_checkpoint

    _tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "corpus").mkdir()
    for i in range(2):
        rows = [json.dumps({"text": d}) for d in _docs(150, seed=i)]
        (tmp_path / "corpus" / f"part{i}.jsonl").write_text("\n".join(rows) + "\n")

    # 1. tokenize
    s = tokenize_main(
        ["--input", str(tmp_path / "corpus"), "--tokenizer", str(tmp_path / "tokenizer.json")]
        + ["--out", str(tmp_path / "tokens")]
    )
    assert s["samples"] == 300 and s["empty"] == s["undecodable"] == 0

    # 2. train a Hugging Face causal LM on bucketed batches
    hf = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64}
    hf |= {"num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 128}
    cfg = {
        "data": {"path": str(tmp_path / "tokens"), "max_length": 128},
        "buckets": {"num_buckets": 3},
        "batching": {"token_budget": 1024},
        "model": {"name": "hf_causal_lm", "vocab_size": s["vocab_size"], "hf_config": hf},
        "train": {"epochs": 2, "lr": 3e-3, "warmup_steps": 2, "log_every": 5},
        "wandb": {"mode": "disabled"},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "checkpoint": {"storage_path": str(tmp_path / "runs"), "run_name": "mine"},
    }
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(cfg))
    assert train_main(["--config", str(tmp_path / "my.yaml")]) == 0

    # 3. export it as a Hugging Face model directory
    out = tmp_path / "my-model"
    args = ["--config", str(tmp_path / "my.yaml"), "--out", str(out)]
    assert export_main([*args, "--tokenizer", str(tmp_path / "tokenizer.json")]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok("the quick brown fox jumps")["input_ids"]])
    ckpt = sorted((tmp_path / "runs" / "mine").glob("checkpoint_*"))[-1]
    state = load_checkpoint(ckpt).model
    emb = model.get_input_embeddings().weight
    torch.testing.assert_close(emb, state["hf.model.embed_tokens.weight"])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
    assert loss < np.log(s["vocab_size"]) - 1  # it learned the corpus' word statistics


def test_tokenized_shards_have_bounded_row_groups(tmp_path, monkeypatch):
    """A large input file is written in row groups of at most ROW_GROUP_ROWS rows (several read
    tasks per shard), not pyarrow's default of up to a million rows in one."""
    from pipeline.data import tokenize_io
    from pipeline.data.tokenize_text import TokenizeFiles

    _tokenizer(tmp_path / "tokenizer.json")
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in _docs(7, 0)))
    monkeypatch.setattr(tokenize_io, "ROW_GROUP_ROWS", 3)
    files = TokenizeFiles(str(tmp_path / "tokenizer.json"), str(src), str(out), "text", False)
    got = files._one(0, "a.jsonl")
    assert len(got["lengths"]) == 7 and not got["error"]
    md = pq.ParquetFile(out / "shard-00000.parquet").metadata
    assert [md.row_group(g).num_rows for g in range(md.num_row_groups)] == [3, 3, 1]
