"""fp32 master weights: a pretrained checkpoint saved in bf16 (as most are) trains fp32 weights
and fp32 AdamW moments, with bf16 only through autocast; a model bucketray builds in another
dtype is cast, and a user factory returning one is refused at the start, naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.core.config import ModelConfig, RunConfig, TrainConfig
from pipeline.learn.factory import build_model
from pipeline.learn.loss import token_sums
from pipeline.learn.model_check import ModelBuildError
from pipeline.learn.optim import build_optimizer, master_weights
from tests.unit.trainer_fixtures import Saver, batches_for, spec

transformers = pytest.importorskip("transformers")

VOCAB = 32
LLAMA = {
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def save_bf16_llama(path: Path) -> dict[str, torch.Tensor]:
    """A tiny Llama saved by save_pretrained in bfloat16; returns its saved weights."""
    conf = dict(LLAMA)
    conf.pop("model_type")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**conf)).to(torch.bfloat16)
    model.save_pretrained(path)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _one_step(model: torch.nn.Module) -> torch.optim.AdamW:
    opt = build_optimizer(model, TrainConfig(lr=1e-3))
    ids = torch.randint(0, VOCAB, (2, 8))
    pos = torch.arange(8).expand(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids, torch.ones_like(ids), pos)
    loss, _ = token_sums(logits, ids)
    loss.backward()
    opt.step()
    return opt


def _float_dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters() if p.is_floating_point()}


def test_a_bf16_pretrained_checkpoint_trains_fp32_weights_and_fp32_adamw_state(tmp_path):
    saved = save_bf16_llama(tmp_path / "llama")
    cfg = ModelConfig(name="hf_causal_lm", vocab_size=VOCAB, hf_pretrained=str(tmp_path / "llama"))
    model = build_model(cfg, max_positions=32)
    assert _float_dtypes(model) == {torch.float32}
    for k, v in model.hf.state_dict().items():  # the checkpoint's values, upcast exactly
        assert torch.equal(v, saved[k].float()), k
    opt = _one_step(model)
    assert _float_dtypes(model) == {torch.float32}
    moments = [s[k] for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")]
    assert moments and {m.dtype for m in moments} == {torch.float32}


def test_a_model_bucketray_builds_in_bf16_is_cast_to_fp32():
    # A config.json that names bf16 (as a checkpoint's does) makes transformers build bf16.
    cfg = ModelConfig(
        name="hf_causal_lm", vocab_size=VOCAB, hf_config={**LLAMA, "dtype": "bfloat16"}
    )
    built = build_model(cfg, max_positions=32)
    assert _float_dtypes(built) == {torch.bfloat16}
    assert _float_dtypes(master_weights(built, cfg)) == {torch.float32}


def bf16_factory(config: dict) -> torch.nn.Module:
    """A `package.module:factory` model whose author returned it in bfloat16."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(config["vocab_size"], 8)
            self.head = torch.nn.Linear(8, config["vocab_size"])

        def forward(self, input_ids, attention_mask, position_ids):
            return self.head(self.embed(input_ids))

    return Model().to(torch.bfloat16)


FACTORY = f"{__name__}:bf16_factory"


def test_a_factory_returning_bf16_parameters_is_refused_naming_the_fix():
    cfg = ModelConfig(name=FACTORY, vocab_size=VOCAB)
    with pytest.raises(ModelBuildError) as e:
        master_weights(build_model(cfg, 32), cfg)
    line = str(e.value)
    assert "\n" not in line
    assert f"model.name={FACTORY!r} returned 3 of 3 parameters in bfloat16" in line
    assert "return the model in float32 (model.float())" in line


def _run_config(tmp: Path, model: dict) -> RunConfig:
    return RunConfig.model_validate(
        {
            "data": {"synthetic": {}},
            "model": {"vocab_size": VOCAB, **model},
            "train": {"epochs": 1, "max_steps": 1, "lr": 1e-3, "bf16": "on"},
            "checkpoint": {"storage_path": str(tmp / "runs"), "every_steps": 1},
            "wandb": {"mode": "disabled", "dir": str(tmp / "wandb")},
        }
    )


def test_the_trainer_starts_fp32_from_a_bf16_checkpoint_and_refuses_a_bf16_factory(tmp_path):
    from pipeline.learn.logger import ListLogger
    from pipeline.train.trainer import Trainer

    save_bf16_llama(tmp_path / "llama")
    cfg = _run_config(tmp_path, {"name": "hf_causal_lm", "hf_pretrained": str(tmp_path / "llama")})
    saver = Saver(tmp_path / "ckpt")
    t = Trainer(cfg, spec(tmp_path), save=saver)
    t.resume(None)
    assert _float_dtypes(t.model) == {torch.float32}
    t.fit(batches_for(), ListLogger())
    state = saver.latest()
    assert {v.dtype for v in state.model.values() if v.is_floating_point()} == {torch.float32}
    moments = [s[k] for s in t.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
    assert moments and {m.dtype for m in moments} == {torch.float32}

    with pytest.raises(ModelBuildError, match="return the model in float32"):
        Trainer(_run_config(tmp_path, {"name": FACTORY}), spec(tmp_path), save=saver)
