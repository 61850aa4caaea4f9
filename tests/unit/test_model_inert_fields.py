"""A Hugging Face model takes its sizes from its own config: the built-in model's size fields are
refused beside it (not silently ignored), and the packing cost model's attention width comes
from the Hugging Face config's hidden size, never from the unused model.d_model."""

from __future__ import annotations

import json

import pytest

from pipeline.core.config import ConfigError
from pipeline.core.epochs import packing_spec
from pipeline.core.packing import attention_width_for
from tests.helpers import tiny_config

HF = {"model_type": "llama", "hidden_size": 48, "intermediate_size": 64}
HF |= {"num_hidden_layers": 1, "num_attention_heads": 2}
PACKED = {"mode": "packed", "row_tokens": 64, "rows_per_step": 2}


def _hf(model: dict, **sections):
    return tiny_config(model={"name": "hf_causal_lm", "hf_config": HF, **model}, **sections)


def test_the_built_in_models_size_fields_are_refused_beside_a_hugging_face_model():
    with pytest.raises(ConfigError) as e:
        _hf({"n_layers": 7, "d_model": 1024})
    msg = str(e.value)
    assert "\n" not in msg
    assert "model.d_model=1024" in msg and "model.n_layers=7" in msg
    assert "hf_causal_lm" in msg and "remove" in msg and "hidden_size" in msg
    # Left at their defaults (as in a copied demo config) they say nothing and are accepted;
    # the tiny run's own sizes are not the defaults, so reset them for the HF model.
    _hf({"d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512})


def _default_sizes() -> dict:
    return {"d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512}


def test_packed_attention_width_comes_from_the_hugging_face_hidden_size(tmp_path):
    cfg = _hf(_default_sizes(), batching=PACKED)
    assert packing_spec(cfg).attention_width == attention_width_for(48)
    # A config.json on disk (file or folder), as the README's own-data steps give it.
    (tmp_path / "config.json").write_text(json.dumps({**HF, "hidden_size": 40}))
    for where in (tmp_path, tmp_path / "config.json"):
        model = {"name": "hf_causal_lm", "hf_config": str(where), **_default_sizes()}
        cfg = tiny_config(model=model, batching=PACKED)
        assert packing_spec(cfg).attention_width == attention_width_for(40)
    # Set explicitly, it wins.
    cfg = _hf(_default_sizes(), batching={**PACKED, "attention_width": 999})
    assert packing_spec(cfg).attention_width == 999


def test_an_unreadable_hidden_size_asks_for_batching_attention_width(tmp_path):
    model = {"name": "hf_causal_lm", "hf_pretrained": "s3://bucket/model", **_default_sizes()}
    cfg = tiny_config(model=model, batching=PACKED)
    with pytest.raises(ConfigError, match=r"set batching.attention_width"):
        packing_spec(cfg)


def test_an_override_to_a_hugging_face_model_drops_a_copied_configs_built_in_sizes(tmp_path):
    from pipeline.core.config import load_config

    (tmp_path / "c.yaml").write_text(
        "data:\n  path: /tmp/x\nmodel:\n  name: tiny_decoder\n  d_model: 768\n  n_layers: 12\n  n_heads: 12\n"
    )
    sets = ["model.name=hf_causal_lm", "model.hf_pretrained=s3://b/models/x"]
    cfg = load_config(tmp_path / "c.yaml", sets)
    assert cfg.model.d_model == 128 and cfg.model.hf_pretrained == "s3://b/models/x"
