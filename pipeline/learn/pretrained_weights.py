"""Whether a pretrained directory's safetensors hold the model its config.json describes.

`transformers` starts every tensor a checkpoint lacks from a random init and ignores the ones it
does not know, and says so in a report that stays in a worker's log: a `model.safetensors`
without layer 1 trains that layer from scratch, and the run ends "successfully". So:

- on the driver, before any worker starts (`check_weights`), each weight file's header is read
  (8 bytes and a JSON header: no tensor is loaded, also on s3://), a file shorter than its
  header describes is named, and the tensor names and shapes are compared with those of the
  model the config builds, made on the `meta` device (no memory). Names only in the model are
  refused when the file has no name the model lacks (nothing could be a renamed tensor), names
  only in the file likewise, and a shape that differs always;
- in each worker (`refuse_mismatch`), transformers' own account of the load (missing,
  unexpected and mismatched keys: its key renaming and tied weights included) is refused when
  it is not empty, so what the driver could not decide is still one line, never a random init.
"""

from __future__ import annotations

import json
import re

import pyarrow.fs as pafs

from pipeline.core.config import ConfigError

__all__ = ["check_weights", "mismatch_line", "refuse_mismatch", "weight_files"]

_KEY = "model.hf_pretrained"
_INDEX = "model.safetensors.index.json"
_SHOWN = 4  # tensor names shown in a line, then a count


def weight_files(fs: pafs.FileSystem, root: str, names: list[str]) -> list[str]:
    """The safetensors files transformers would load: those the index names, else
    model.safetensors, else every *.safetensors."""
    if _INDEX in names:
        with fs.open_input_stream(f"{root}/{_INDEX}") as f:
            return sorted(set(json.loads(f.read()).get("weight_map", {}).values()))
    if "model.safetensors" in names:
        return ["model.safetensors"]
    return sorted(n for n in names if n.endswith(".safetensors"))


def _damaged(uri: str, name: str, why: str) -> ConfigError:
    return ConfigError(
        f"{_KEY}={uri!r}: {name} is truncated or damaged ({why}): copy it again, or save the "
        "model again with save_pretrained"
    )


def _header(fs: pafs.FileSystem, root: str, name: str, uri: str) -> dict[str, tuple]:
    """{tensor name: shape} from a safetensors file's header, after checking that the file is
    as long as the header says (a copy cut short is named here, not deep in a worker)."""
    try:
        f = fs.open_input_file(f"{root}/{name}")
    except FileNotFoundError:
        raise ConfigError(
            f"{_KEY}={uri!r}: {name} is missing ({_INDEX} names it): copy the whole directory"
        ) from None
    with f:
        size = f.size()
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise _damaged(uri, name, f"{size:,} bytes, no complete header")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _damaged(uri, name, f"unreadable header: {e}") from None
    header.pop("__metadata__", None)
    want = 8 + n + max((int(v["data_offsets"][1]) for v in header.values()), default=0)
    if want != size:
        raise _damaged(uri, name, f"{size:,} bytes where its header describes {want:,}")
    return {k: tuple(v["shape"]) for k, v in header.items()}


def _names(keys) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else ""
    return ", ".join(keys[:_SHOWN]) + more


def mismatch_line(uri: str, missing, unexpected, mismatched: dict) -> str:
    """One line naming what does not match (`mismatched`: name -> (file shape, model shape))."""
    parts = []
    if missing:
        parts.append(
            f"{len(missing)} tensors missing, which would start from random ({_names(missing)})"
        )
    if unexpected:
        parts.append(f"{len(unexpected)} tensors the model does not have ({_names(unexpected)})")
    if mismatched:
        shown = sorted(mismatched)[:_SHOWN]
        shapes = ", ".join(
            f"{k}: {list(mismatched[k][0])} vs {list(mismatched[k][1])}" for k in shown
        )
        more = f" and {len(mismatched) - _SHOWN} more" if len(mismatched) > _SHOWN else ""
        parts.append(f"{len(mismatched)} tensors of another shape (file vs model: {shapes}{more})")
    return (
        f"{_KEY}={uri!r}: the weights do not match the model its config.json describes: "
        f"{'; '.join(parts)}; save the model again with save_pretrained, or correct config.json"
    )


def _meta_model(conf: dict):
    """The model config.json describes, on the meta device (names and shapes, no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = dict(conf)
    hf = AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf)


def _matches(patterns, key: str) -> bool:
    return any(re.search(p, key) for p in patterns or ())


def check_weights(fs: pafs.FileSystem, root: str, names: list[str], conf: dict, uri: str) -> None:
    """The driver's check (module docstring). ConfigError, one line, on what it can decide."""
    file_shapes: dict[str, tuple] = {}
    for name in weight_files(fs, root, names):
        file_shapes.update(_header(fs, root, name, uri))
    if conf.get("auto_map") or not conf.get("model_type"):
        return  # built by the directory's own code: the worker's load decides
    try:
        model = _meta_model(conf)
    except Exception:  # noqa: BLE001 - what building reveals is the worker's one line
        return
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    missing = {
        k
        for k in expected.keys() - file_shapes.keys() - tied
        if not _matches(getattr(model, "_keys_to_ignore_on_load_missing", None), k)
    }
    unexpected = {
        k
        for k in file_shapes.keys() - expected.keys()
        if not _matches(getattr(model, "_keys_to_ignore_on_load_unexpected", None), k)
    }
    mismatched = {
        k: (file_shapes[k], expected[k])
        for k in file_shapes.keys() & expected.keys()
        if file_shapes[k] != expected[k]
    }
    if missing and unexpected:  # maybe renamed tensors: transformers' load decides
        missing = unexpected = set()
    if missing or unexpected or mismatched:
        raise ConfigError(mismatch_line(uri, missing, unexpected, mismatched))


def refuse_mismatch(uri: str, info: dict) -> None:
    """In a worker: refuse a load whose account (from_pretrained's output_loading_info) is not
    empty, naming the tensors."""
    mismatched = {k: (tuple(a), tuple(b)) for k, a, b in info.get("mismatched_keys") or ()}
    missing, unexpected = info.get("missing_keys") or (), info.get("unexpected_keys") or ()
    if missing or unexpected or mismatched:
        raise ConfigError(mismatch_line(uri, missing, unexpected, mismatched))
    errors = info.get("error_msgs") or ()
    if errors:
        raise ConfigError(
            f"{_KEY}={uri!r}: loading the weights failed ({' '.join(str(errors[0]).split())})"
        )
