"""model.hf_pretrained: a tiny Llama the test saves itself (no download) is loaded with its
weights, safetensors only, no remote code unless allowed, checked on the driver first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.core.config import ConfigError, ModelConfig, load_config
from pipeline.learn.factory import HFCausalLM, build_model
from pipeline.learn.pretrained import check_pretrained, local_copy

transformers = pytest.importorskip("transformers")

VOCAB = 300


def save_tiny_llama(path: Path, layers: int = 1, **extra) -> Path:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def _cfg(path, **kw) -> ModelConfig:
    return ModelConfig(name="hf_causal_lm", vocab_size=VOCAB, hf_pretrained=str(path), **kw)


def test_pretrained_weights_are_loaded_not_a_random_init(tmp_path):
    src = save_tiny_llama(tmp_path / "llama")
    model = build_model(_cfg(src), max_positions=64)
    assert isinstance(model, HFCausalLM)
    saved = transformers.LlamaForCausalLM.from_pretrained(src).state_dict()
    for k, v in model.hf.state_dict().items():
        assert torch.equal(v, saved[k]), k
    ids = torch.randint(0, VOCAB, (2, 8))
    pos = torch.arange(8).expand(2, 8)
    assert model(ids, torch.ones_like(ids), pos).shape == (2, 8, VOCAB)


def test_a_bucket_directory_is_copied_once_without_pickles(tmp_path):
    src = save_tiny_llama(tmp_path / "llama")
    (src / "training_args.bin").write_bytes(b"not loaded")
    uri = f"file://{src}"  # any pyarrow URI takes the bucket path (s3:// on a cluster)
    copy = local_copy(uri, cache_root=str(tmp_path / "cache"))
    assert copy != src and (copy / "config.json").is_file()
    assert sorted(p.name for p in copy.iterdir()) == sorted(
        p.name for p in src.iterdir() if p.suffix != ".bin"
    )
    assert local_copy(uri, cache_root=str(tmp_path / "cache")) == copy  # once per node
    model = build_model(_cfg(uri), max_positions=64)  # loads through the copy
    assert model.hf.config.vocab_size == VOCAB


@pytest.mark.parametrize(
    "setup, kw, match",
    [
        ("pickle", {}, "no \\*.safetensors weights \\(only pytorch_model.bin, which are pickles"),
        ("auto_map", {}, "needs its own Python code"),
        ("plain", {"vocab_size": 512}, "vocab_size=300 differs from model.vocab_size=512"),
        ("missing", {}, "no such directory"),
    ],
)
def test_the_driver_refuses_what_a_worker_would_fail_on(tmp_path, setup, kw, match):
    path = tmp_path / "llama"
    if setup != "missing":
        save_tiny_llama(path)
    if setup == "pickle":  # what an older save_pretrained wrote: a pickle instead
        (path / "model.safetensors").rename(path / "pytorch_model.bin")
    if setup == "auto_map":
        conf = json.loads((path / "config.json").read_text())
        conf["auto_map"] = {"AutoModelForCausalLM": "modeling_x.X"}
        (path / "config.json").write_text(json.dumps(conf))
    cfg = ModelConfig(
        **{"name": "hf_causal_lm", "vocab_size": VOCAB, "hf_pretrained": str(path), **kw}
    )
    with pytest.raises(ConfigError, match=match):
        check_pretrained(cfg, max_positions=64)
    if setup == "auto_map":  # allowed on request
        check_pretrained(_cfg(path, hf_trust_remote_code=True), max_positions=64)


def test_the_longest_bucket_must_fit_the_models_positions(tmp_path):
    from pipeline.train.launch import check_pretrained_model as check_model

    src = save_tiny_llama(tmp_path / "llama")
    run = load_config(
        "configs/local.yaml",
        ["model.name=hf_causal_lm", f"model.hf_pretrained={src}", f"model.vocab_size={VOCAB}"],
    )
    check_model(run, 128)
    with pytest.raises(
        ConfigError, match="max_position_embeddings=128 is below the top bucket edge 512"
    ):
        check_model(run, 512)


def test_pretrained_config_fields_are_strict():
    with pytest.raises(ValueError, match="hf_config has no effect with model.hf_pretrained"):
        ModelConfig(name="hf_causal_lm", hf_config={"model_type": "llama"}, hf_pretrained="/m")
    with pytest.raises(
        ValueError, match="hf_pretrained has no effect with model.name='tiny_decoder'"
    ):
        ModelConfig(hf_pretrained="/m")
