"""Model construction errors are user errors: checked on the driver before any worker starts,
and named by their key when a worker still meets one.

A missing or malformed `model.hf_config`, an unknown `model_type`, `transformers` not
installed, or a factory that cannot be imported fails the same way on every worker and every
retry. The driver checks what it can from the config alone (`check_model`, no model is
built); `build_model_or_refuse` turns what only building reveals into a `ModelBuildError`, a
ConfigError, so Ray Train raises it at the first failure instead of retrying it.
"""

from __future__ import annotations

from torch import nn

from pipeline.core.config import ConfigError, ModelConfig
from pipeline.learn.factory import build_model, hf_config_dict, model_kind

__all__ = ["ModelBuildError", "build_model_or_refuse", "check_model", "check_packed_model"]


def _out_of_memory(e: BaseException) -> bool:
    """Memory, not configuration: left to Ray Train's retries (another node may have room)."""
    return isinstance(e, MemoryError) or "out of memory" in str(e).lower()


class ModelBuildError(ConfigError):
    """The model named by `model.*` cannot be built: the message names the key and the fix."""


def check_model(cfg: ModelConfig) -> None:
    """Refuse on the driver a model that no worker could build (see the module docstring)."""
    kind = model_kind(cfg.name)
    if kind in ("registered", "factory"):
        return  # a factory may import only on the workers (their working_dir): built there
    if kind == "unknown":
        try:
            build_model(cfg, 1)  # the registry's refusal, which names the choices
        except ValueError as e:
            raise ModelBuildError(str(e)) from None
        return
    if cfg.hf_pretrained is not None:
        # The saved model's own config.json decides: its directory, vocabulary and positions are
        # checked on the driver once the edges are known (pipeline.learn.pretrained).
        _require_transformers()
        return
    try:
        d = hf_config_dict(cfg.hf_config)
    except (ValueError, OSError) as e:
        raise ModelBuildError(str(e)) from None
    model_type = d.get("model_type")
    if not model_type:
        raise ModelBuildError("model.hf_config needs a model_type (e.g. llama, gpt2, qwen2)")
    CONFIG_MAPPING = _require_transformers().CONFIG_MAPPING
    if model_type not in CONFIG_MAPPING:
        raise ModelBuildError(
            f"model.hf_config: unknown model_type {model_type!r} for transformers (known ones "
            "include llama, gpt2, qwen2, mistral); fix the config or upgrade transformers"
        )


def check_packed_model(cfg: ModelConfig) -> None:
    """Refuse on the driver, before any worker starts, a Hugging Face model whose attention a
    packed row's per-document mask cannot confine (pipeline.learn.hf_packed), naming the key.
    (A pretrained directory's config.json is read once its listing has been checked.)"""
    if model_kind(cfg.name) != "hf":
        return
    from pipeline.learn.hf_packed import packed_attention_problem, packed_refusal
    from pipeline.learn.model_record import resolved_hf_config

    try:
        conf = resolved_hf_config(cfg)
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - what building reveals is the worker's one line
        return
    why = packed_attention_problem(conf)
    if why:
        raise ModelBuildError(packed_refusal(_key_of(cfg), why))


def _require_transformers():
    try:
        import transformers
    except ImportError:
        raise ModelBuildError(
            "model.name=hf_causal_lm needs Hugging Face transformers: pip install 'bucketray[hf]'"
        ) from None
    return transformers


def _key_of(cfg: ModelConfig) -> str:
    """The setting a build error is about: the pretrained directory when there is one."""
    if model_kind(cfg.name) != "hf":
        return f"model.name={cfg.name}"
    if cfg.hf_pretrained is not None:
        return f"model.hf_pretrained={cfg.hf_pretrained}"
    return "model.hf_config"


def build_model_or_refuse(cfg: ModelConfig, max_positions: int) -> nn.Module:
    """`build_model`, with a configuration error raised as a one-line ModelBuildError."""
    try:
        return build_model(cfg, max_positions)
    except ConfigError:
        raise
    except Exception as e:  # transformers' own validation errors derive from Exception only
        if _out_of_memory(e):
            raise
        key = _key_of(cfg)
        text = " ".join(str(e).split()) or type(e).__name__
        raise ModelBuildError(f"{key}: cannot build the model ({text})") from e
