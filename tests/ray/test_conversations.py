"""A team's first fine-tune, end to end: conversations tokenized with a tokenizer folder's chat
template (loss mask on the assistant's turns), then a saved tiny Llama trained from its
pretrained weights through the real Ray Train path. Everything is built by the test."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from tests.unit.test_chat_tokenize import CONV, save_tokenizer_folder

pytestmark = [pytest.mark.ray, pytest.mark.slow]
transformers = pytest.importorskip("transformers")


def test_conversations_tokenized_with_a_mask_train_a_pretrained_llama(cluster, tmp_path, capsys):
    from jobs.tokenize import main as tokenize_main
    from jobs.train import main as train_main
    from pipeline.learn.checkpoint import load_checkpoint

    folder = save_tokenizer_folder(tmp_path / "tok")
    (tmp_path / "chats").mkdir()
    rng = np.random.default_rng(0)
    for f in range(2):
        rows = []
        for _ in range(40):
            conv = [dict(m) for m in CONV[: int(rng.choice([3, 5]))]]
            rows.append(json.dumps({"messages": conv}))
        (tmp_path / "chats" / f"part{f}.jsonl").write_text("\n".join(rows) + "\n")
    args = ["--input", str(tmp_path / "chats"), "--tokenizer", folder]
    s = tokenize_main([*args, "--messages-column", "messages", "--out", str(tmp_path / "tokens")])
    assert s["samples"] == 80 and s["empty"] == s["undecodable"] == 0
    t = pa.concat_tables([pq.read_table(p) for p in sorted((tmp_path / "tokens").glob("shard-*"))])
    assert t.schema.field("loss_mask").type == pa.list_(pa.int8())
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids, mask = t["input_ids"][0].as_py(), t["loss_mask"][0].as_py()
    assert tok.convert_ids_to_tokens([i for i, m in zip(ids, mask, strict=True) if m])[:3] == [
        "fine", "thanks", "<|end|>",
    ]  # fmt: skip
    # A bare tokenizer.json has no chat template: one line, exit 2.
    with pytest.raises(SystemExit) as e:
        tokenize_main(
            ["--input", str(tmp_path / "chats"), "--tokenizer", f"{folder}/tokenizer.json"]
            + ["--messages-column", "messages", "--out", str(tmp_path / "x")]
        )
    assert e.value.code == 2 and "needs a tokenizer folder" in capsys.readouterr().err

    vocab = len(tok)
    llama = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(llama).save_pretrained(tmp_path / "llama")
    saved = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "llama").state_dict()
    cfg = {
        "data": {"path": str(tmp_path / "tokens"), "max_length": 64},
        "buckets": {"num_buckets": 2},
        "batching": {"token_budget": 256},
        "model": {"name": "hf_causal_lm", "vocab_size": vocab},
        "train": {"epochs": 1, "max_steps": 3, "lr": 1e-9, "warmup_steps": 0, "log_every": 1},
        "wandb": {"mode": "disabled"},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "checkpoint": {"storage_path": str(tmp_path / "runs"), "run_name": "ft"},
    }
    cfg["model"]["hf_pretrained"] = str(tmp_path / "llama")
    (tmp_path / "ft.yaml").write_text(yaml.safe_dump(cfg))
    assert train_main(["--config", str(tmp_path / "ft.yaml")]) == 0
    ckpt = sorted((tmp_path / "runs" / "ft").glob("checkpoint_*"))[-1]
    state = load_checkpoint(ckpt).model
    # lr 1e-9: the trained weights are the pretrained ones, not a random init.
    for k, v in saved.items():
        torch.testing.assert_close(state[f"hf.{k}"], v, rtol=0, atol=1e-6)

    # Exported with its tokenizer folder (chat template included) for from_pretrained.
    from jobs.export_hf import main as export_main

    out = tmp_path / "ft-model"
    assert (
        export_main(
            ["--config", str(tmp_path / "ft.yaml"), "--tokenizer", folder, "--out", str(out)]
        )
        == 0
    )
    assert transformers.AutoTokenizer.from_pretrained(out).chat_template == tok.chat_template
    assert transformers.AutoModelForCausalLM.from_pretrained(out).config.vocab_size == vocab
