"""A pydantic validation error of the run config as one line: each error names its field (the
variant tags pydantic adds to a location dropped), what is wrong, and the value given where a
range or a type was missed."""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["VARIANT_TAGS", "error_line", "format_validation_error"]

# Tags of the discriminated sections' variants: pydantic puts them in error locations.
VARIANT_TAGS = {
    "buckets": {"explicit", "optimised"},
    "batching": {"token_budget", "fixed", "packed"},
}


_RANGE_ERRORS = {
    "finite_number",
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "int_parsing",
    "int_from_float",
    "float_parsing",
    "literal_error",
    "bool_parsing",
}


def error_line(e: dict) -> str:
    """One pydantic error as `field: what is wrong` (a message that names its field: as is)."""
    parts = [str(p) for p in e["loc"]]
    if len(parts) > 1 and parts[1] in VARIANT_TAGS.get(parts[0], ()):
        parts.pop(1)
    loc = ".".join(parts)
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        msg = "unknown field; check the spelling (see configs/local.yaml for every field)"
    elif e["type"] == "missing" and loc == "data":
        msg = "required section is missing: give data.path or a data.synthetic section"
    elif e["type"] == "missing":
        msg = "required field is missing"
    elif e["type"] == "union_tag_invalid":
        tags = e["ctx"]["expected_tags"]
        return f"{loc}.mode={e['ctx']['tag']!r} is not a mode: choose one of {tags}"
    if parts and msg.startswith(tuple(f"{parts[0]}{c}" for c in ".: ")):
        return msg  # the message already names its field
    if e["type"] in _RANGE_ERRORS:
        msg = f"{msg}, got {e['input']!r}"
    return f"{loc}: {msg}" if loc else msg


def format_validation_error(err: ValidationError) -> str:
    """A whole validation error as one line, its errors joined by `; `."""
    return "invalid config: " + "; ".join(error_line(e) for e in err.errors())
