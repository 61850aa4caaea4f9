"""jobs.export_hf --tokenizer: the exported model's special-token ids are the tokenizer's, not the
model type's defaults (Llama's bos=1, eos=2), so AutoTokenizer knows them and generate() stops
at the tokenizer's end-of-sequence token."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from jobs import export_hf
from pipeline.learn.checkpoint import DataPosition, TrainState, save_checkpoint
from pipeline.learn.factory import build_model
from pipeline.learn.model_record import model_record
from tests.helpers import TINY_LLAMA, tiny_config, tiny_raw

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]
# Not Llama's layout (bos=1, eos=2): [PAD]=0, [UNK]=1, [BOS]=2, [EOS]=3.
SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def _tokenizer(path) -> tokenizers.Tokenizer:
    from tokenizers import models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A [EOS]", special_tokens=[("[BOS]", 2), ("[EOS]", 3)]
    )
    tok.save(str(path))
    return tok


def _trained_checkpoint(tmp_path, vocab: int):
    """A run directory with one checkpoint of a tiny Llama taught that "[BOS] a b c" ends with
    [EOS] (a few hundred full-batch steps: a second on a CPU)."""
    hf = {**TINY_LLAMA, "num_hidden_layers": 1}
    raw = tiny_raw(tmp_path, model={"name": "hf_causal_lm", "vocab_size": vocab, "hf_config": hf})
    cfg = tiny_config(tmp_path, model=raw["model"])
    torch.manual_seed(0)
    model = build_model(cfg.model, max_positions=64)
    seqs = torch.tensor([[2, 4, 5, 6, 3], [2, 7, 8, 9, 3], [2, 4, 8, 6, 3]])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    pos = torch.arange(seqs.shape[1])[None].expand_as(seqs)
    for _ in range(300):
        logits = model(seqs, torch.ones_like(seqs), pos)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, vocab), seqs[:, 1:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    rdir = tmp_path / "runs" / cfg.checkpoint.run_name
    state = TrainState(
        model=model.state_dict(),
        optimizer={},
        scheduler={},
        position=DataPosition(5, 0, "h", 1, {}, 300),
        wandb_run_id="x",
        model_record=model_record(cfg.model),
    )
    save_checkpoint(rdir / "checkpoint_step00000300", state, rank=0)
    config = tmp_path / "my.yaml"
    config.write_text(yaml.safe_dump(raw))
    return config


def test_export_takes_the_special_token_ids_from_the_tokenizer_and_generate_stops_at_eos(
    tmp_path, capsys
):
    tok = _tokenizer(tmp_path / "tokenizer.json")
    config = _trained_checkpoint(tmp_path, tok.get_vocab_size())
    out = tmp_path / "out"
    args = [
        "--config",
        str(config),
        "--out",
        str(out),
        "--tokenizer",
        str(tmp_path / "tokenizer.json"),
    ]
    assert export_hf.main(args) == 0
    for name in ("config.json", "generation_config.json"):
        got = json.loads((out / name).read_text())
        assert (got["bos_token_id"], got["eos_token_id"], got["pad_token_id"]) == (2, 3, 0), name

    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (hf_tok.bos_token, hf_tok.eos_token, hf_tok.pad_token) == ("[BOS]", "[EOS]", "[PAD]")
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id) == (2, 3, 0)
    assert hf_tok.unk_token == "[UNK]"
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    prompt = hf_tok("a b", return_tensors="pt", add_special_tokens=False)["input_ids"]
    prompt = torch.cat([torch.tensor([[hf_tok.bos_token_id]]), prompt], dim=1)
    with torch.no_grad():
        got = model.generate(prompt, max_new_tokens=20, do_sample=False)[0].tolist()
    # The model learned to end after three words: generation stops at [EOS], not 20 tokens on.
    assert got[-1] == 3 and len(got) < prompt.shape[1] + 20, got
    assert got.count(3) == 1
    assert "special tokens from the tokenizer: bos 2, eos 3, pad 0" in capsys.readouterr().out


def test_export_of_a_tokenizer_folder_takes_its_ids_too(tmp_path):
    tok = _tokenizer(tmp_path / "tokenizer.json")
    folder = tmp_path / "tok"
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "tokenizer.json"),
        bos_token="[BOS]",
        eos_token="[EOS]",
        pad_token="[PAD]",
        unk_token="[UNK]",
    ).save_pretrained(folder)
    config = _trained_checkpoint(tmp_path, tok.get_vocab_size())
    out = tmp_path / "out"
    assert (
        export_hf.main(["--config", str(config), "--out", str(out), "--tokenizer", str(folder)])
        == 0
    )
    got = json.loads((out / "generation_config.json").read_text())
    assert (got["bos_token_id"], got["eos_token_id"], got["pad_token_id"]) == (2, 3, 0)
