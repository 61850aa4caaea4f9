"""Your own model: `package.module:factory`, `hf_causal_lm` from a local config, one forward signature."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline.core.config import ConfigError, ModelConfig, validate
from pipeline.learn.factory import HFCausalLM, build_model
from pipeline.learn.loss import token_sums

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


class Bigram(nn.Module):
    def __init__(self, vocab_size: int, width: int):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, width)
        self.out = nn.Linear(width, vocab_size)

    def forward(self, input_ids, attention_mask, position_ids):
        return self.out(self.emb(input_ids))


def make_bigram(config: dict) -> nn.Module:
    assert config["max_positions"] == 16
    return Bigram(config["vocab_size"], config["width"])


def _batch(vocab: int, B: int = 2, L: int = 8):
    ids = torch.randint(3, vocab, (B, L), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, L, dtype=torch.int64)
    mask[1, 5:] = 0
    ids[1, 5:] = 0
    pos = torch.arange(L).expand(B, L) * mask
    return ids, mask, pos


def test_package_module_factory_gets_options_vocab_and_max_positions():
    cfg = ModelConfig(name=f"{__name__}:make_bigram", vocab_size=40, options={"width": 8})
    model = build_model(cfg, max_positions=16)
    assert isinstance(model, Bigram) and model.emb.weight.shape == (40, 8)
    assert model(*_batch(40)).shape == (2, 8, 40)


@pytest.mark.parametrize(
    "name, match",
    [
        ("no_such_pkg.mod:f", "cannot import no_such_pkg"),
        (f"{__name__}:missing", "has no callable missing"),
        (f"{__name__}:TINY_LLAMA", "has no callable"),
        ("nope", "hf_causal_lm"),
    ],
)
def test_bad_model_names_say_what_to_do(name, match):
    with pytest.raises(ValueError, match=match):
        build_model(ModelConfig(name=name), max_positions=16)


def test_model_config_accepts_hf_config_and_options_in_yaml_shape():
    data = {"synthetic": {}}
    model = {"name": "hf_causal_lm", "vocab_size": 300, "hf_config": TINY_LLAMA}
    cfg = validate({"data": data, "model": model})
    assert cfg.model.hf_config["model_type"] == "llama"
    with pytest.raises(ConfigError, match="model.options"):
        validate({"data": data, "model": {"options": [1, 2]}})
    # Checked on the driver, before any worker starts.
    with pytest.raises(ConfigError, match="needs model.hf_config"):
        validate({"data": data, "model": {"name": "hf_causal_lm"}})
    with pytest.raises(ConfigError, match="package.module:factory"):
        validate({"data": data, "model": {"name": "mypkg.models:"}})


def test_hf_causal_lm_from_inline_dict_and_config_json(tmp_path):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    a = build_model(ModelConfig(name="hf_causal_lm", vocab_size=300, hf_config=TINY_LLAMA), 64)
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "vocab_size": 300}))
    torch.manual_seed(0)
    b = build_model(ModelConfig(name="hf_causal_lm", vocab_size=300, hf_config=str(tmp_path)), 64)
    assert isinstance(a, HFCausalLM) and type(a.hf).__name__ == "LlamaForCausalLM"
    ids, mask, pos = _batch(300)
    la, lb = a(ids, mask, pos), b(ids, mask, pos)
    assert la.shape == (2, 8, 300)
    torch.testing.assert_close(la, lb)
    # Padding on the right changes nothing for the real tokens.
    alone = a(ids[1:, :5], mask[1:, :5], pos[1:, :5])
    torch.testing.assert_close(la[1:, :5], alone, rtol=1e-4, atol=1e-5)
    # bucketray's loss applies to its logits, and the state round-trips through weights_only.
    labels = ids.masked_fill(mask == 0, -100)
    loss_sum, _ = token_sums(la, labels)
    loss_sum.backward()
    assert all(p.grad is not None for p in a.parameters())
    torch.save(a.state_dict(), tmp_path / "m.pt")
    b.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    torch.testing.assert_close(b(ids, mask, pos), la.detach())


@pytest.mark.parametrize(
    "hf_config, match",
    [
        (None, "needs model.hf_config"),
        ({**TINY_LLAMA, "vocab_size": 256}, "vocab_size=256 differs from model.vocab_size=300"),
        ({"hidden_size": 32}, "model_type"),
        ("/no/such/config.json", "no such local file"),
        ({**TINY_LLAMA, "max_position_embeddings": 32}, "max_position_embeddings=32"),
    ],
)
def test_hf_config_errors_name_the_field(hf_config, match):
    pytest.importorskip("transformers")
    cfg = ModelConfig(name="hf_causal_lm", vocab_size=300, hf_config=TINY_LLAMA)
    cfg = cfg.model_copy(update={"hf_config": hf_config})  # past the driver-side check
    with pytest.raises(ValueError, match=match):
        build_model(cfg, max_positions=64)


def _imports_within(package: Path, prefix: str) -> dict[str, set[str]]:
    """module -> modules of the same package it imports, at any depth of its code (an import
    inside a function counts: it is a cycle all the same, only deferred)."""
    names = {p.stem for p in package.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in names:
        deps = set()
        for node in ast.walk(ast.parse((package / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
                deps.add(node.module.removeprefix(prefix))
            elif isinstance(node, ast.Import):
                deps |= {
                    a.name.removeprefix(prefix) for a in node.names if a.name.startswith(prefix)
                }
        graph[name] = (deps & names) - {name}
    return graph


def test_learn_modules_import_each_other_one_way():
    """No import cycle inside pipeline.learn: the registry (model) never reaches back for the
    builder (factory), which is build_model's one home."""
    import pipeline.learn

    graph = _imports_within(Path(pipeline.learn.__file__).parent, "pipeline.learn.")
    assert "model" in graph["factory"]
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"pipeline.learn.{start} imports itself back through {sorted(seen)}"
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
