"""The runtime stands apart from what measures it: layers checked on the source and on imports.

`pipeline` (core, data, learn, train, and report: the offline bucket report) is the library;
`bench` (the benchmarks) and `jobs` sit above it, and only the benchmark commands import `bench`.
The source check reads every import statement, including those inside functions, so a lazy
import cannot slip a layer; the subprocess check proves a runtime entry point loads neither the
benchmarks nor matplotlib.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = (
    "pipeline.train.launch",
    "pipeline.data.api",
    "pipeline.learn.factory",
    "jobs.train",
    "jobs.plan_buckets",  # the report draws its PNGs with matplotlib imported when drawing
)
# The commands that measure the library: the only modules of jobs/ that may import bench.
BENCHMARK_COMMANDS = {"jobs/bench_data.py", "jobs/sizing.py"}


def _imported_roots(path: Path) -> set[str]:
    """Top-level package of every absolute import in the file (module level or not)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def _offenders(folder: str, forbidden: set[str]) -> dict[str, list[str]]:
    out = {}
    for p in sorted((ROOT / folder).rglob("*.py")):
        bad = sorted(_imported_roots(p) & forbidden)
        if bad:
            out[str(p.relative_to(ROOT))] = bad
    return out


def test_the_library_imports_neither_benchmarks_nor_jobs():
    assert not (ROOT / "pipeline" / "bench").exists(), "benchmarks live in bench/, beside pipeline/"
    assert _offenders("pipeline", {"bench", "jobs"}) == {}


def test_benchmarks_do_not_import_jobs():
    assert _offenders("bench", {"jobs"}) == {}


def test_no_user_command_imports_the_benchmarks():
    """train, evaluate, tokenize, plan_buckets, plot_run, export_hf, make_data, ...: a user command
    runs on the library alone; the bucket report it prints lives in pipeline.report."""
    users = {k: v for k, v in _offenders("jobs", {"bench"}).items() if k not in BENCHMARK_COMMANDS}
    assert users == {}
    assert {f"jobs/{m}.py" for m in ("train", "plan_buckets", "plot_run")} <= {
        str(p.relative_to(ROOT)) for p in (ROOT / "jobs").glob("*.py")
    }  # the check above reads the commands it names


def test_benchmark_modules_share_only_public_names():
    """The seam between bench modules (renderers included) is what each exports: no private
    helper is imported from another module."""
    private = {}
    for p in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bench":
                names = [a.name for a in node.names if a.name.startswith("_")]
                if names:
                    private.setdefault(str(p.relative_to(ROOT)), []).extend(names)
    assert private == {}


def test_the_report_names_no_ray_or_pyarrow_and_draws_only_in_plot():
    """The bucket report is pure numpy on core: matplotlib only in its plot module, torch and
    transformers only in the optional Hugging Face samplers, each imported inside a function."""
    assert _offenders("pipeline/report", {"ray", "pyarrow"}) == {}
    drawing = _offenders("pipeline/report", {"matplotlib", "torch", "transformers"})
    assert drawing == {
        "pipeline/report/plot.py": ["matplotlib"],
        "pipeline/report/hf_peers.py": ["torch", "transformers"],
    }


def test_core_names_no_ray_torch_pyarrow_or_matplotlib_even_lazily():
    """Core plans: it reads no parquet, writes no files and draws nothing."""
    forbidden = {"ray", "torch", "pyarrow", "matplotlib"}
    assert _offenders("pipeline/core", forbidden) == {}


def test_learn_names_no_ray():
    assert _offenders("pipeline/learn", {"ray"}) == {}


def test_importing_the_runtime_loads_no_benchmark_and_no_matplotlib():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in RUNTIME)
        + "print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    loaded = set(eval(out.stdout.strip()))  # a printed list of top-level module names
    assert "pipeline" in loaded and "jobs" in loaded  # the imports did run
    assert not loaded & {"bench", "matplotlib"}, sorted(loaded & {"bench", "matplotlib"})


# Which layer may import which: jobs -> bench -> train -> data -> core, learn -> core and
# report -> core (train also uses learn). An import against the arrows is a cycle between layers
# in waiting.
LAYERS_MAY_IMPORT = {
    "pipeline.core": set(),
    "pipeline.learn": {"pipeline.core"},
    "pipeline.data": {"pipeline.core"},
    "pipeline.report": {"pipeline.core"},
    "pipeline.train": {"pipeline.core", "pipeline.data", "pipeline.learn"},
}


def _layer_imports(folder: Path) -> dict[str, set[str]]:
    """pipeline.<layer> -> the other pipeline layers its files import (module level or not)."""
    out: dict[str, set[str]] = {}
    for p in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "pipeline" and len(parts) > 1:
                    layer = "pipeline." + parts[1]
                    if layer != f"pipeline.{folder.name}":
                        out.setdefault(str(p.relative_to(ROOT)), set()).add(layer)
    return out


def test_the_library_layers_import_one_way():
    against = {}
    for layer, allowed in LAYERS_MAY_IMPORT.items():
        for path, used in _layer_imports(ROOT / "pipeline" / layer.split(".")[1]).items():
            if used - allowed:
                against[path] = sorted(used - allowed)
    assert against == {}, f"imports against the layers {LAYERS_MAY_IMPORT}: {against}"


def _module_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (module level or not)."""
    folder = ROOT.joinpath(*package.split("."))
    graph: dict[str, set[str]] = {}
    for p in sorted(folder.glob("*.py")):
        me = f"{package}.{p.stem}"
        deps = graph.setdefault(me, set())
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            deps.update(
                n for n in names if n.startswith(package + ".") and n.count(".") == me.count(".")
            )
        deps.discard(me)
    return graph


def _a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph`, or [] (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


@pytest.mark.parametrize(
    "package",
    [
        "pipeline.core",
        "pipeline.learn",
        "pipeline.data",
        "pipeline.report",
        "pipeline.train",
        "bench",
        "jobs",
    ],
)
def test_modules_of_a_package_import_each_other_one_way(package):
    """No import cycle inside a package, lazy imports included: a cycle means a rule sits on
    the wrong side of two modules (or a module imports a name through another's re-export)."""
    assert _a_cycle(_module_graph(package)) == []


def test_no_two_test_modules_share_a_name():
    """pytest imports test modules by their basename (the test folders are not packages): two
    files of one name in two folders stop the whole session at collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
