"""The README's "Your own data and model" section, followed literally from a fresh folder holding
only .jsonl files and a tokenizer.json: tokenize with a held-out split, train a Hugging Face
causal LM from a copy of configs/local.yaml with the README's edits (and a few `--set`s that make
it a CPU-minutes run), evaluate it from another directory, export it, and `generate()` stops at
the tokenizer's end-of-sequence token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ANIMALS = ["cat", "dog", "fox", "owl", "bee", "cow"]
VERBS = ["eats", "sees", "likes", "finds"]
THINGS = ["fish", "grass", "seeds", "bread", "milk"]
SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]  # not Llama's ids: bos 2, eos 3


def _tokenizer(path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, processors

    words = ["the", ".", "and"] + ANIMALS + VERBS + THINGS
    vocab = {t: i for i, t in enumerate(SPECIALS + words)}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A [EOS]", special_tokens=[("[BOS]", 2), ("[EOS]", 3)]
    )
    tok.save(str(path))


def _corpus(folder: Path) -> None:
    """20 files of 30 documents of one to three clauses, each ending in "." (then [EOS]):
    "the cat eats the fish and the owl sees the milk ."."""
    rng = np.random.default_rng(0)
    folder.mkdir()

    def clause() -> str:
        return f"the {rng.choice(ANIMALS)} {rng.choice(VERBS)} the {rng.choice(THINGS)}"

    for f in range(20):
        docs = [" and ".join(clause() for _ in range(rng.integers(1, 4))) + " ." for _ in range(30)]
        (folder / f"part{f:02d}.jsonl").write_text(
            "".join(json.dumps({"text": d}) + "\n" for d in docs)
        )


def _my_yaml(folder: Path, vocab_size: int) -> None:
    """configs/local.yaml copied, with the README's edits: the data (the tokenized folder,
    whose held-out split eval.split: validation evaluates), the model and a run name of its own."""
    cfg = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    cfg["data"].pop("synthetic")
    cfg["data"]["path"] = "data/mine"
    cfg["model"] = {
        "name": "hf_causal_lm",
        "vocab_size": vocab_size,
        "hf_config": {
            "model_type": "llama",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 512,
        },
    }
    cfg["checkpoint"]["run_name"] = "my-run"
    assert cfg["eval"]["split"] == "validation"  # kept as the demo has it
    (folder / "my.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _run(args: list[str], cwd: Path, timeout: float = 900) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["WANDB_MODE"] = "disabled"
    p = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{args[0]} exited {p.returncode}:\n{out[-4000:]}"
    assert "Traceback" not in out, out[-4000:]
    return out


def test_the_readme_own_data_steps_reach_a_model_whose_generate_stops_at_eos(tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    folder = tmp_path / "fresh"
    folder.mkdir()
    _corpus(folder / "my_corpus")
    _tokenizer(folder / "tokenizer.json")

    # 1. tokenize, holding out a share of the files as split validation
    out = _run(
        ["jobs.tokenize", "--input", "my_corpus/", "--tokenizer", "tokenizer.json"]
        + ["--out", "data/mine", "--heldout", "0.05"],
        folder,
    )
    vocab = int(out.split("set model.vocab_size: ")[1].split()[0])
    assert "as split validation" in out

    # 2. train (the --set lines make it minutes on 2 CPU cores: short rows, more epochs)
    _my_yaml(folder, vocab)
    fast = ["batching.row_tokens=64", "batching.rows_per_step=4", "train.epochs=6"]
    fast += ["train.lr=1e-2", "eval.every_steps=50", "data.max_length=64"]
    out = _run(
        ["jobs.train", "--config", "my.yaml", *[a for s in fast for a in ("--set", s)]], folder
    )
    assert "held-out loss" in out
    run_dir = folder / "runs" / "my-run"
    assert run_dir.is_dir()

    # ... evaluated again from another directory (the run recorded where its data is)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = _run(["jobs.evaluate", str(run_dir)], elsewhere)
    assert "eval/loss" in out

    # 3. export for AutoModelForCausalLM.from_pretrained
    _run(
        ["jobs.export_hf", "--config", "my.yaml", "--tokenizer", "tokenizer.json"]
        + ["--out", "my-model"],
        folder,
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(folder / "my-model").eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder / "my-model")
    assert (tok.bos_token_id, tok.eos_token_id) == (2, 3)
    prompt = tok("the cat", return_tensors="pt")["input_ids"][:, :-1]  # [BOS] the cat
    assert prompt[0, 0].item() == 2
    with torch.no_grad():
        got = model.generate(prompt, max_new_tokens=30, do_sample=False)[0].tolist()
    assert got[-1] == tok.eos_token_id and len(got) < prompt.shape[1] + 30, tok.decode(got)
    assert tok.decode(got, skip_special_tokens=True).endswith(".")
