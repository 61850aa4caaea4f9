"""A pretrained Hugging Face causal LM to start from: `model.hf_pretrained`, a directory that
`save_pretrained` wrote (config.json plus safetensors weights), local or on a bucket (s3://...).

Loaded safely: weights from safetensors only (never a pickle: `.bin` / `.pt` files are refused,
not read), no hub access (`local_files_only`), and no Python from the directory unless
`model.hf_trust_remote_code` says so. `check_pretrained` runs on the driver before any worker
starts, reading config.json, the file listing and the weight files' headers only (a file cut
short, tensors missing, extra or of another shape are refused there: pipeline/learn/
pretrained_weights.py); each worker then loads the weights itself (a bucket directory is copied
once per node into a local cache first) and refuses a load transformers reports as incomplete,
where it would start the missing tensors from random. The weights are loaded in float32 whatever
dtype the checkpoint holds (pipeline/learn/optim.py: fp32 master weights).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import pyarrow.fs as pafs

from pipeline.core.config import ConfigError, ModelConfig
from pipeline.learn.pretrained_weights import check_weights, refuse_mismatch

__all__ = ["check_pretrained", "load_pretrained", "local_copy", "read_config_json"]

_KEY = "model.hf_pretrained"
# Weight files a save_pretrained directory may hold that unpickle Python objects when loaded.
_PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _fs(uri: str) -> tuple[pafs.FileSystem, str]:
    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))


def _listing(uri: str) -> tuple[pafs.FileSystem, str, list[str]]:
    fs, root = _fs(uri)
    info = fs.get_file_info(root)
    if info.type != pafs.FileType.Directory:
        raise ConfigError(
            f"{_KEY}={uri!r}: no such directory; give a folder written by save_pretrained "
            "(config.json and *.safetensors), local or s3://..."
        )
    files = fs.get_file_info(pafs.FileSelector(root, recursive=False))
    return fs, root, sorted(f.base_name for f in files if f.type == pafs.FileType.File)


def check_pretrained(cfg: ModelConfig, max_positions: int) -> dict:
    """The directory's config.json, after checking what a worker would otherwise fail on hours
    later: safetensors present, remote code only when allowed, the vocabulary and the longest
    bucket within the model's limits. Raises ConfigError, one line naming the key."""
    uri = cfg.hf_pretrained
    assert uri is not None
    fs, root, names = _listing(uri)
    if "config.json" not in names:
        raise ConfigError(f"{_KEY}={uri!r} has no config.json: save the model with save_pretrained")
    if not any(n.endswith(".safetensors") for n in names):
        pickled = [n for n in names if n.endswith(_PICKLED)]
        raise ConfigError(
            f"{_KEY}={uri!r} has no *.safetensors weights"
            + (
                f" (only {', '.join(pickled)}, which are pickles and never loaded)"
                if pickled
                else ""
            )
            + ": save it again with save_pretrained(..., safe_serialization=True)"
        )
    conf = _config_json(fs, root, uri)
    if conf.get("auto_map") and not cfg.hf_trust_remote_code:
        raise ConfigError(
            f"{_KEY}={uri!r} needs its own Python code (config.json auto_map); read it, then set "
            "model.hf_trust_remote_code=true to run it, or use a model class transformers ships"
        )
    vocab = conf.get("vocab_size")
    if vocab is not None and vocab != cfg.vocab_size:
        raise ConfigError(
            f"{_KEY}: the model's vocab_size={vocab} differs from model.vocab_size="
            f"{cfg.vocab_size}: set model.vocab_size={vocab} (the tokenizer's vocabulary)"
        )
    limit = conf.get("max_position_embeddings")
    if limit is not None and limit < max_positions:
        raise ConfigError(
            f"{_KEY}: the model's max_position_embeddings={limit} is below the top bucket edge "
            f"{max_positions}: lower data.max_length (or the bucket edges) to at most {limit}"
        )
    check_weights(fs, root, names, conf, uri)
    return conf


def _config_json(fs: pafs.FileSystem, root: str, uri: str) -> dict:
    with fs.open_input_stream(f"{root}/config.json") as f:
        try:
            return json.loads(f.read())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{_KEY}: {uri}/config.json is not valid JSON ({e})") from None


def read_config_json(uri: str) -> dict:
    """The config.json of the save_pretrained directory `uri` (local or s3://)."""
    fs, root = _fs(uri)
    try:
        return _config_json(fs, root, uri)
    except FileNotFoundError:
        raise ConfigError(
            f"{_KEY}={uri!r} has no config.json: save the model with save_pretrained"
        ) from None


def local_copy(uri: str, cache_root: str | None = None) -> Path:
    """A local directory holding `uri`'s files: `uri` itself when local, else a copy under
    `cache_root` (default ~/.cache/bucketray/pretrained) named by the URI, made once per node
    (written under a temporary name and renamed, so a half copy is never used). Pickled weight
    files are not copied."""
    if "://" not in uri:
        return Path(os.path.expanduser(uri))
    root_dir = Path(cache_root or os.path.expanduser("~/.cache/bucketray/pretrained"))
    dest = root_dir / hashlib.sha256(uri.encode()).hexdigest()[:16]
    if dest.is_dir():
        return dest
    fs, root, names = _listing(uri)
    tmp = root_dir / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    try:
        for name in names:
            if name.endswith(_PICKLED):
                continue
            with fs.open_input_stream(f"{root}/{name}") as src, open(tmp / name, "wb") as dst:
                shutil.copyfileobj(src, dst, 16 * 2**20)
        try:
            tmp.rename(dest)
        except OSError:  # another worker on this node finished first
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def load_pretrained(cfg: ModelConfig, max_positions: int):
    """The `transformers` model in cfg.hf_pretrained, weights from safetensors only, in fp32."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ImportError(
            "model.hf_pretrained needs Hugging Face transformers: pip install 'bucketray[hf]'"
        ) from None
    check_pretrained(cfg, max_positions)
    import torch
    from transformers.utils import logging as hf_logging

    # Its load report would only reach this worker's log: the account it returns is refused
    # below in one line instead (mismatched sizes included, which it would raise pointing at
    # that report).
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(local_copy(cfg.hf_pretrained)),
            # fp32 master weights whatever dtype the checkpoint holds (most are bf16, which
            # transformers would keep): bf16 comes only through autocast (train.bf16).
            dtype=torch.float32,
            use_safetensors=True,
            local_files_only=True,
            trust_remote_code=cfg.hf_trust_remote_code,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
        )
    finally:
        hf_logging.set_verbosity(level)
    refuse_mismatch(cfg.hf_pretrained, info)
    return model
