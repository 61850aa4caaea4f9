"""A config file read as YAML, strictly: a key written twice is an error, and a file YAML cannot
read is named with its line and column.

PyYAML's `safe_load` keeps the last of two equal keys without a word, so a section written twice
(`model:` near the top and again at the bottom) silently loses the first one's fields; and its
scanner errors (a tab where YAML wants spaces) come as multi-line tracebacks. Both become one
ConfigError line naming the file, the key or the place, and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.core.sections import ConfigError

__all__ = ["DuplicateKeyError", "load_yaml_file", "load_yaml_text"]


class DuplicateKeyError(yaml.YAMLError):
    """A mapping with the same key twice (raised while the document is constructed)."""

    def __init__(self, key: Any, first_line: int, second_line: int):
        super().__init__(f"key {key!r} appears twice (lines {first_line} and {second_line})")
        self.key, self.first_line, self.second_line = key, first_line, second_line


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding one key twice."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            if key in seen:
                raise DuplicateKeyError(key, seen[key], line)
        except TypeError:  # an unhashable key: SafeLoader's own error names it
            continue
        seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _where(e: yaml.MarkedYAMLError) -> str:
    mark = e.problem_mark or e.context_mark
    return f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""


def _describe(e: yaml.YAMLError) -> str:
    """One line for a YAML error: where, what, and the fix where there is a usual one."""
    if isinstance(e, DuplicateKeyError):
        return (
            f"{e}: keep one and merge the fields of both (YAML would keep only the last, "
            "without a word)"
        )
    if not isinstance(e, yaml.MarkedYAMLError):
        return " ".join(str(e).split())
    mark = e.problem_mark or e.context_mark
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
    problem = " ".join((e.problem or e.context or type(e).__name__).split())
    if "'\\t'" in problem:
        return f"{where}a tab character; YAML indents with spaces only: replace the tab with spaces"
    return f"{where}{problem} (check the indentation and brackets there)"


def load_yaml_text(text: str, source: str = "<text>") -> Any:
    """`text` parsed as YAML (safe types only; a key twice refused); ConfigError naming
    `source` when it cannot be read."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: {_describe(e)}") from None


def load_yaml_file(path: str | Path) -> Any:
    """The YAML document in `path` (see `load_yaml_text`)."""
    p = Path(path)
    return load_yaml_text(p.read_text(), str(p))
