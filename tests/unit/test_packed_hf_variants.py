"""Packed rows and Hugging Face attention variants: a sliding window (one for every layer, or
per layer type) is applied within each document, so packed logits equal each document alone;
attention that per-document attention cannot confine or compute (ALiBi, chunked, local,
recurrent or linear layers, soft-capped scores) is refused in one line naming the key, on the driver before any worker starts and in the
worker; an architecture no check knows is caught by one packed forward against the documents
alone."""

from __future__ import annotations

import pytest
import torch

import pipeline.learn.factory as factory
from pipeline.core.config import ConfigError
from pipeline.learn.factory import build_model
from pipeline.learn.model_check import ModelBuildError
from pipeline.learn.packed_attention import Documents, block_causal_mask, require_packed_support
from pipeline.train.preflight import check_before_start
from tests.helpers import TINY_LLAMA, tiny_config
from tests.unit.test_packed_attention import (
    VOCAB,
    _fwd,
    _one_doc_batches,
    _packed_batch,
    _packed_slices,
)

transformers = pytest.importorskip("transformers")

WINDOW = 4  # shorter than three of the six documents (9, 12 and 7 tokens)
BASE = {k: v for k, v in TINY_LLAMA.items() if k != "model_type"}
WINDOWED = {
    "mistral": {"model_type": "mistral", "sliding_window": WINDOW},
    "qwen2": {  # layer 0 full, layer 1 sliding: one mask per layer type
        "model_type": "qwen2",
        "use_sliding_window": True,
        "sliding_window": WINDOW,
        "max_window_layers": 1,
    },
    "gemma2": {  # its own scaling (query_pre_attn_scalar); soft-capping is refused below
        "model_type": "gemma2",
        "sliding_window": WINDOW,
        "head_dim": 8,
        "query_pre_attn_scalar": 8,
        "attn_logit_softcapping": None,
    },
    "cohere2": {
        "model_type": "cohere2",
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "starcoder2": {"model_type": "starcoder2", "sliding_window": WINDOW},
}
# Attention that per-document attention cannot confine or compute, and what the line names.
UNCONFINED = {
    "gemma2-softcap": (
        {**BASE, "model_type": "gemma2", "head_dim": 8, "attn_logit_softcapping": 50.0},
        "soft-caps attention scores",
    ),
    "bloom": ({"model_type": "bloom", "hidden_size": 32, "n_layer": 1, "n_head": 4}, "ALiBi"),
    "mpt": ({"model_type": "mpt", "d_model": 32, "n_layers": 1, "n_heads": 4}, "ALiBi"),
    "falcon-alibi": (
        {"model_type": "falcon", "hidden_size": 32, "num_hidden_layers": 1, "alibi": True},
        "ALiBi",
    ),
    "mamba": ({"model_type": "mamba", "hidden_size": 32, "num_hidden_layers": 1}, "linear"),
    "llama4-chunked": (
        {**BASE, "model_type": "llama4_text", "attention_chunk_size": 8},
        "chunked_attention",
    ),
    "gpt_neo-local": (
        {
            "model_type": "gpt_neo",
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 4,
            "attention_types": [[["global", "local"], 1]],
            "window_size": WINDOW,
        },
        "'local' layers",
    ),
}


def _hf(hf_config: dict):
    torch.manual_seed(0)
    cfg = tiny_config(model={"name": "hf_causal_lm", "vocab_size": VOCAB, "hf_config": hf_config})
    return build_model(cfg.model, max_positions=64).eval()


def _packed_cfg(tmp_path, hf_config: dict):
    return tiny_config(
        tmp_path,
        model={"name": "hf_causal_lm", "vocab_size": VOCAB, "hf_config": hf_config},
        batching={"mode": "packed", "row_tokens": 64, "rows_per_step": 4},
    )


def test_a_sliding_window_mask_keeps_the_last_window_keys_of_each_document():
    doc = torch.tensor([[1, 1, 1, 1, 1, 2, 2, 2]], dtype=torch.int32)
    m = block_causal_mask(doc, window=3)[0, 0]
    assert m[4].tolist() == [False, False, True, True, True, False, False, False]
    assert m[7].tolist() == [False] * 5 + [True] * 3


@pytest.mark.parametrize("arch", sorted(WINDOWED))
def test_packed_logits_equal_each_document_alone_with_a_sliding_window(arch):
    model = _hf({**BASE, **WINDOWED[arch]})
    with torch.no_grad():
        packed = _fwd(model, _packed_batch())
        for (r, a, b), one in zip(_packed_slices(), _one_doc_batches(), strict=True):
            alone = _fwd(model, one)[0, : b - a]
            torch.testing.assert_close(packed[r, a:b], alone, rtol=1e-4, atol=1e-5)
    require_packed_support(model)  # and the worker's checks let it train


@pytest.mark.parametrize("arch", sorted(UNCONFINED))
def test_attention_a_mask_cannot_confine_is_refused_on_the_driver_naming_the_key(tmp_path, arch):
    hf_config, says = UNCONFINED[arch]
    with pytest.raises(ModelBuildError) as e:
        check_before_start(_packed_cfg(tmp_path, hf_config))
    msg = str(e.value)
    assert msg.startswith("batching.mode=packed cannot train model.hf_config: ")
    assert says in msg and "batching.mode=token_budget" in msg and "\n" not in msg
    assert isinstance(e.value, ConfigError)  # deterministic: no Ray Train retries


def test_the_same_model_trains_padded():
    cfg = tiny_config(
        model={"name": "hf_causal_lm", "vocab_size": VOCAB, "hf_config": UNCONFINED["bloom"][0]}
    )
    check_before_start(cfg)


@pytest.mark.parametrize("arch", ["bloom", "mpt"])
def test_the_worker_refuses_an_alibi_model_before_its_forward_pass(arch):
    with pytest.raises(
        ValueError, match=r"cannot train model.hf_config: model_type=\w+ adds ALiBi"
    ):
        require_packed_support(_hf(UNCONFINED[arch][0]))


def test_a_model_whose_attention_crosses_documents_is_caught_by_one_packed_forward(monkeypatch):
    model = _hf(TINY_LLAMA)
    require_packed_support(model)
    # as if the model ignored the documents of the mask it is given
    monkeypatch.setattr(factory, "packed_documents", lambda doc: Documents(torch.ones_like(doc)))
    with pytest.raises(ValueError, match=r"a document packed behind another gets other logits"):
        require_packed_support(model)


def test_a_pretrained_alibi_model_is_refused_once_its_directory_is_read(tmp_path):
    from pipeline.train.launch import check_pretrained_model

    bloom = transformers.AutoConfig.for_model(**UNCONFINED["bloom"][0], vocab_size=VOCAB)
    transformers.AutoModelForCausalLM.from_config(bloom).save_pretrained(tmp_path / "bloom")
    model = {"name": "hf_causal_lm", "vocab_size": VOCAB, "hf_pretrained": str(tmp_path / "bloom")}
    cfg = tiny_config(
        tmp_path, model=model, batching={"mode": "packed", "row_tokens": 64, "rows_per_step": 4}
    )
    check_before_start(cfg)  # the directory is not read before Ray starts
    with pytest.raises(
        ModelBuildError, match=rf"cannot train model.hf_pretrained={tmp_path}/bloom"
    ):
        check_pretrained_model(cfg, 64)
