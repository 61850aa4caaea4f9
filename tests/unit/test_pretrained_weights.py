"""A pretrained directory whose weights are not the model its config.json describes (a layer
missing, an extra tensor, another shape, a file cut short) is refused naming the tensors or the
file: on the driver where the headers decide it, in the worker from transformers' own account
otherwise; never trained from a random init."""

from __future__ import annotations

import json
import os

import pytest
import torch

from pipeline.core.config import ConfigError, ModelConfig
from pipeline.learn.model_check import ModelBuildError, build_model_or_refuse
from pipeline.learn.pretrained import check_pretrained
from tests.unit.test_pretrained import VOCAB, save_tiny_llama

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _save(path, **extra):
    return save_tiny_llama(path, layers=2, **extra)


def _rewrite(path, edit):
    f = path / "model.safetensors"
    tensors = safetensors_torch.load_file(f)
    safetensors_torch.save_file(edit(tensors), f, metadata={"format": "pt"})


def _cfg(path) -> ModelConfig:
    return ModelConfig(name="hf_causal_lm", vocab_size=VOCAB, hf_pretrained=str(path))


def test_a_folder_without_layer_1_is_refused_on_the_driver_naming_the_tensors(tmp_path):
    src = _save(tmp_path / "m")
    _rewrite(src, lambda t: {k: v for k, v in t.items() if ".layers.1." not in k})
    with pytest.raises(ConfigError) as e:
        check_pretrained(_cfg(src), max_positions=64)
    msg = str(e.value)
    assert msg.startswith(f"model.hf_pretrained='{src}': the weights do not match the model")
    assert "9 tensors missing, which would start from random (model.layers.1." in msg
    assert "\n" not in msg


def test_an_extra_tensor_and_another_shape_are_refused_on_the_driver(tmp_path):
    src = _save(tmp_path / "extra")
    _rewrite(src, lambda t: {**t, "model.layers.2.mlp.up_proj.weight": torch.zeros(32, 16)})
    with pytest.raises(ConfigError, match=r"1 tensors the model does not have \(model.layers.2"):
        check_pretrained(_cfg(src), max_positions=64)
    src = _save(tmp_path / "shape")
    conf = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**conf, "intermediate_size": 48}))
    with pytest.raises(ConfigError, match=r"6 tensors of another shape \(file vs model: "):
        check_pretrained(_cfg(src), max_positions=64)


def test_a_truncated_safetensors_file_is_named_on_the_driver(tmp_path):
    src = _save(tmp_path / "m")
    f = src / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) - 1000)
    with pytest.raises(ConfigError) as e:
        check_pretrained(_cfg(src), max_positions=64)
    assert "model.safetensors is truncated or damaged (" in str(e.value)
    assert str(e.value).startswith(f"model.hf_pretrained='{src}'")


def test_tied_embeddings_missing_from_the_file_are_not_missing(tmp_path):
    src = _save(tmp_path / "tied", tie_word_embeddings=True)
    assert "lm_head.weight" not in safetensors_torch.load_file(src / "model.safetensors")
    check_pretrained(_cfg(src), max_positions=64)
    model = build_model_or_refuse(_cfg(src), max_positions=64)
    assert model.hf.lm_head.weight.data_ptr() == model.hf.model.embed_tokens.weight.data_ptr()


def test_what_only_the_load_reveals_is_refused_in_the_worker_naming_the_directory(tmp_path):
    # a renamed tensor: missing and unexpected at once, which the driver leaves to transformers
    src = _save(tmp_path / "m")
    name = "model.layers.1.mlp.up_proj.weight"
    _rewrite(src, lambda t: {("renamed." + k if k == name else k): v for k, v in t.items()})
    check_pretrained(_cfg(src), max_positions=64)
    with pytest.raises(ConfigError) as e:  # deterministic: raised at once, never retried
        build_model_or_refuse(_cfg(src), max_positions=64)
    msg = str(e.value)
    assert msg.startswith(f"model.hf_pretrained='{src}': the weights do not match")
    assert f"1 tensors missing, which would start from random ({name})" in msg
    assert "report" not in msg and "\n" not in msg


def test_a_build_error_of_a_pretrained_model_names_hf_pretrained_not_hf_config(tmp_path):
    src = _save(tmp_path / "m")
    conf = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**conf, "num_attention_heads": 3}))
    with pytest.raises(ModelBuildError) as e:
        build_model_or_refuse(_cfg(src), max_positions=64)
    assert str(e.value).startswith(f"model.hf_pretrained={src}: cannot build the model (")
