"""BENCHMARKS.md's tables (bench.tables): a marked block is replaced and nothing else, the committed
document is the rendering of the committed JSON, its prose holds no figure and its generated
blocks hold only tables, and a missing JSON is an error naming the command that writes it."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from bench import table_blocks as tb
from bench import tables
from bench.tables import BLOCKS, README_HEADLINE, load_results, render, replace_block

ROOT = Path(__file__).resolve().parents[2]
DOC = "# B\nprose\n<!-- a:start -->\nold a\n<!-- a:end -->\nmiddle\n<!-- b:start -->\n<!-- b:end -->\nend\n"


@pytest.fixture(scope="module")
def results() -> dict:
    return load_results(ROOT / "benchmarks", [n for files, _ in BLOCKS.values() for n in files])


def test_a_block_is_replaced_between_its_markers_and_everything_else_is_kept():
    new = replace_block(DOC, "| x |\n|---|\n| 1 |\n", "a")
    assert new == DOC.replace("old a", "| x |\n|---|\n| 1 |")
    assert replace_block(new, "| x |\n|---|\n| 1 |", "a") == new  # idempotent
    both = replace_block(new, "| y |", "b")
    assert both.endswith("<!-- b:start -->\n| y |\n<!-- b:end -->\nend\n")
    assert both.startswith("# B\nprose\n<!-- a:start -->\n| x |")


def test_a_start_marker_with_a_note_keeps_its_note():
    readme = "intro\n<!-- bench:headline:start (written by make bench) -->\nold\n"
    readme += "<!-- bench:headline:end -->\nrest\n"
    new = replace_block(readme, "| t |", README_HEADLINE)
    assert new == readme.replace("\nold\n", "\n| t |\n")


@pytest.mark.parametrize(
    "doc", ["no markers", "<!-- a:start -->\nno end", "<!-- a:end -->\n<!-- a:start -->"]
)
def test_a_missing_or_reversed_block_is_an_error_naming_its_markers(doc):
    with pytest.raises(ValueError, match="<!-- a:start --> ... <!-- a:end -->"):
        replace_block(doc, "| t |", "a")


def test_a_missing_json_is_an_error_naming_the_command_that_writes_it(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="run `python -m bench.padding --out "):
        load_results(tmp_path, ["padding"])
    md = tmp_path / "B.md"
    md.write_text((ROOT / "BENCHMARKS.md").read_text())
    with pytest.raises(
        SystemExit, match=r"error: .*delivery\.json not found: run `python -m bench.delivery"
    ):
        tables.main(["--md", str(md), "--dir", str(tmp_path)])
    assert md.read_text() == (ROOT / "BENCHMARKS.md").read_text()  # nothing half-written


def test_benchmarks_md_and_the_readme_block_are_the_rendering_of_the_committed_json(results):
    doc = (ROOT / "BENCHMARKS.md").read_text()
    assert render(doc, results) == doc, "BENCHMARKS.md is stale: run `make bench-render`"
    readme = (ROOT / "README.md").read_text()
    assert render(readme, results, tables.README_BLOCKS) == readme
    assert set(tables.README_BLOCKS) == set(_blocks(readme))


def _blocks(doc: str) -> dict[str, str]:
    return dict(re.findall(r"<!-- ([\w:-]+):start[^>]*-->\n(.*?)<!-- \1:end -->", doc, re.S))


def test_the_prose_holds_no_figure_and_the_blocks_only_tables():
    doc = (ROOT / "BENCHMARKS.md").read_text()
    blocks = _blocks(doc)
    assert set(BLOCKS) == set(blocks)
    prose = re.sub(r"<!-- ([\w:-]+):start.*?<!-- \1:end -->", "", doc, flags=re.S)
    figures = re.findall(r"\d+\.\d+|\d{1,3}(?:,\d{3})+|\d+ ?%|\b\d{2,}\b", prose)
    assert figures == [], "figures belong in the generated tables"
    for name in BLOCKS:
        lines = [ln for ln in blocks[name].splitlines() if ln]
        assert lines and all(ln.startswith("|") for ln in lines), name
    assert 0 < doc.index("## Outcome: held-out loss") < doc.index("<!-- outcome-ran:start -->")


def test_the_first_steps_table_without_the_row_cache_says_off(results):
    r = copy.deepcopy(results)
    run = r["delivery"]["delivery"]["first_steps"][0]
    run |= {"row_cache": False, "warm": None, "first_step_cold_s": [2.0]}
    row = tb.first_steps(r).splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[6] == "off" and cells[7] == "2.0"  # no empty-cache start; one cold start
    assert cells[-3] == f"{tb._decodes(run['cold'], run['row_groups'])} / -"
    assert cells[-2] == "off"


def test_a_figure_missing_from_the_json_renders_as_not_available():
    assert tb.columns("a=x.y:.2f | b=z/1e3:.1f", [{"x": {}, "z": 2500}]).endswith("| n/a | 2.5 |")


def test_a_quick_run_without_the_token_budget_round_renders_not_measured(results):
    r = copy.deepcopy(results)
    del r["training"]["training"]["token_budget"]
    assert tb.training_budget(r).splitlines()[2] == "| not measured |"
