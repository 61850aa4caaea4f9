"""`--set a.b=c` overrides: each value is coerced to the type of the field it sets.

A value is not parsed as YAML 1.1 on its own (where `on`, `no` and `2024` stop being text): the
dotted path is looked up in the config's models, through the variants of a section, and

- a text field (str, a choice of words, `str | None`) takes the text as written; `null` or `~`
  means None only where None is allowed;
- a number field takes the number the text spells (`1e5` is 100000 for an int field; `.inf`
  and `nan` parse, so range checks can refuse them);
- a bool field takes the text, which the model reads (`true`/`false`, `on`/`off`, `1`/`0`);
- lists, tuples, mappings and whole sections are parsed as YAML flow (`[0, 770, 8192]`), also
  for a field that takes text or a mapping (`model.hf_config={model_type: llama, ...}` is the
  mapping; `model.hf_config=path/config.json` the text); a key written twice is an error.

Setting a field that belongs to one variant of a section (`batching.mode=fixed`, `buckets.edges`,
`data.path`, `data.synthetic.*`) drops the fields of the other variants that came from the config
file, so an override can switch a section (`batching.token_budget=16384` on a packed config also
sets its mode to token_budget); an override that sets both sides is still an error.
"""

from __future__ import annotations

import types
import typing
from enum import Enum
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel

from pipeline.core.sections import ConfigError
from pipeline.core.yamlfile import load_yaml_text

__all__ = ["OverrideError", "apply_overrides", "coerce", "field_annotation"]

_NULL = ("null", "~")
_SECTION = object()  # the value of a section on the way to the field an override sets
_SPECIAL_FLOATS = {".inf": "inf", "+.inf": "inf", "-.inf": "-inf", ".nan": "nan"}


class OverrideError(ValueError):
    """A malformed `--set` item, phrased with its fix."""


def _alternatives(ann: Any) -> list[Any]:
    """The alternatives of an annotation, Annotated and unions unwrapped."""
    origin = typing.get_origin(ann)
    if origin is Annotated:
        return _alternatives(typing.get_args(ann)[0])
    if origin in (Union, types.UnionType):
        return [a for arg in typing.get_args(ann) for a in _alternatives(arg)]
    return [ann]


def _models(ann: Any) -> list[type[BaseModel]]:
    return [a for a in _alternatives(ann) if isinstance(a, type) and issubclass(a, BaseModel)]


def field_annotation(model: type[BaseModel], parts: list[str]) -> Any | None:
    """The annotation of the field at `parts` under `model` (any variant that has it), or None."""
    ann: Any = model
    for p in parts:
        found = [m.model_fields[p] for m in _models(ann) if p in m.model_fields]
        if not found:
            return None
        ann = found[0].annotation
    return ann


def _is_text(a: Any) -> bool:
    if a is str or (isinstance(a, type) and issubclass(a, Enum)):
        return True
    return typing.get_origin(a) is Literal and all(isinstance(v, str) for v in typing.get_args(a))


def _number(text: str, want_int: bool) -> int | float | None:
    t = text.strip()
    t = _SPECIAL_FLOATS.get(t.lower(), t)
    try:
        return int(t)
    except ValueError:
        pass
    try:
        f = float(t)
    except ValueError:
        return None
    return int(f) if want_int and f.is_integer() else f


def _yaml(text: str) -> Any:
    try:
        return load_yaml_text(text, "value")
    except ConfigError as e:
        raise OverrideError(str(e)) from None


def _is_collection(a: Any) -> bool:
    """A mapping, list, tuple or section type: what a YAML flow value (`{...}`, `[...]`) is."""
    origin = typing.get_origin(a) or a
    return origin in (dict, list, tuple) or bool(_models(a))


def coerce(ann: Any, text: str) -> Any:
    """The value `text` means for a field annotated `ann` (None: unknown field, read as YAML)."""
    if ann is None:
        return _yaml(text)
    alts = _alternatives(ann)
    if type(None) in alts and text.strip() in _NULL:
        return None
    alts = [a for a in alts if a is not type(None)]
    numeric = [a for a in alts if a in (int, float)]
    if numeric:
        n = _number(text, want_int=float not in numeric)
        return text if n is None else n  # not a number: the model names the field
    if text.lstrip().startswith(("{", "[")) and any(_is_collection(a) for a in alts):
        return _yaml(text)  # a flow mapping or list, also where text is allowed too
    if any(_is_text(a) for a in alts) or bool in alts:
        return text
    return _yaml(text)


def _switch(model: type[BaseModel], node: dict, key: str, value: Any, keep: set[str]) -> None:
    """Drop from `node` the fields of the variants that setting `key` rules out (but not `keep`).
    Setting a field to None (`data.path=null`) chooses nothing."""
    if value is None:
        return
    variants = _models(model)
    if len(variants) > 1:  # a discriminated section: choose by the field, or the mode's value
        chosen = [m for m in variants if key in m.model_fields]
        if key == "mode":
            chosen = [
                m for m in variants if value in typing.get_args(m.model_fields["mode"].annotation)
            ]
        allowed = {f for m in chosen for f in m.model_fields}
        if chosen and len(chosen) < len(variants):
            for k in [k for k in node if k not in allowed and k not in keep]:
                del node[k]
            # A field of one variant (`batching.token_budget`) switches the file's mode to it.
            one = chosen[0].model_fields if len(chosen) == 1 else {}
            if "mode" in one and key != "mode" and "mode" not in keep:
                mode = one["mode"].default
                if node.get("mode", mode) != mode:
                    node["mode"] = mode
        return
    for group in getattr(variants[0], "exclusive_groups", ()) if variants else ():
        if key in group:
            others = {k for g in variants[0].exclusive_groups if g is not group for k in g}
            for k in [k for k in node if k in others and k not in keep]:
                del node[k]


def apply_overrides(raw: dict, overrides: list[str], model: type[BaseModel]) -> dict:
    """Apply `a.b=c` overrides to a nested dict (a new dict), coercing each value to its field."""
    out = _deepcopy(raw)
    explicit: set[str] = set()  # dotted paths set by these overrides, never dropped
    for item in overrides:
        if "=" not in item:
            raise OverrideError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.lr=3e-4")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise OverrideError(f"--set {item!r}: empty name in {key!r}; e.g. --set train.lr=3e-4")
        try:
            value = coerce(field_annotation(model, parts), text)
        except OverrideError as e:
            raise OverrideError(f"--set {key}: {e}") from None
        node = out
        for i, p in enumerate(parts):
            explicit.add(".".join(parts[: i + 1]))
            ann = field_annotation(model, parts[:i])
            if ann is not None:
                keep = {k for k in node if ".".join([*parts[:i], k]) in explicit}
                _switch(ann, node, p, value if i == len(parts) - 1 else _SECTION, keep)
            if i == len(parts) - 1:
                node[p] = value
                break
            nxt = node.setdefault(p, {})
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise OverrideError(f"--set {key}: {'.'.join(parts[: i + 1])} is not a section")
            node = nxt
    return out


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d
