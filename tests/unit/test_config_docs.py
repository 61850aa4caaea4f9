"""Every config field says what it is in one short line, and docs/config.md explains every field
of every section: the code stays readable, the detail lives in one page."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from pipeline.core.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
MOST_WORDS = 20  # one line, as litgpt's args.py writes them


def _sections(model: type[BaseModel], prefix: str = "") -> dict[str, list[type[BaseModel]]]:
    """Dotted section path -> the models (variants) it may hold, at any depth."""

    def models(tp) -> list[type[BaseModel]]:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return [tp]
        return [m for a in typing.get_args(tp) for m in models(a)]

    out: dict[str, list[type[BaseModel]]] = {}
    for name, info in model.model_fields.items():
        variants = models(info.annotation)
        if variants:
            out[prefix + name] = variants
            for v in variants:
                out |= _sections(v, f"{prefix}{name}.")
    return out


SECTIONS = _sections(RunConfig)
FIELDS = sorted(
    {(s, f) for s, variants in SECTIONS.items() for m in variants for f in m.model_fields}
)


@pytest.mark.parametrize("section, field", FIELDS, ids=[f"{s}.{f}" for s, f in FIELDS])
def test_every_field_has_a_one_line_description_of_at_most_20_words(section, field):
    texts = {
        m.model_fields[field].description for m in SECTIONS[section] if field in m.model_fields
    }
    for text in texts:
        assert text and "\n" not in text, f"{section}.{field}: no description"
        words = len(text.split())
        assert words <= MOST_WORDS, (
            f"{section}.{field}: {words} words; keep one line here and move the rest to "
            "docs/config.md"
        )


def _doc_tables() -> dict[str, str]:
    """docs/config.md's text under each "## `section`" / "### `section.sub`" heading."""
    doc = (ROOT / "docs/config.md").read_text()
    parts = re.split(r"^#{2,3} `([\w.]+)`.*$", doc, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_docs_config_explains_every_field_under_its_section():
    tables = _doc_tables()
    missing = [f"{s}.{f}" for s, f in FIELDS if f"| `{f}` |" not in tables.get(s, "")]
    assert missing == [], f"docs/config.md does not explain: {missing}"
    assert set(tables) == set(SECTIONS), "a heading of docs/config.md names no section"
