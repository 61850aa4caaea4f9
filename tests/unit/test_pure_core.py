"""The pure core imports no Ray: plans, edges, collation and metric math are testable anywhere.

The rule is a package boundary: every module under `pipeline.core` (no Ray, no torch) and
`pipeline.learn` (torch, no Ray) is imported in a fresh interpreter and Ray must stay unloaded.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pipeline.core
import pipeline.learn


def _modules(pkg) -> list[str]:
    return [pkg.__name__] + [f"{pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]


def _loaded_after_import(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + f"print(sorted(m for m in sys.modules if m.split('.')[0] in {prefixes!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return eval(out.stdout.strip())  # a printed list of module names


def test_pure_packages_do_not_import_ray():
    mods = _modules(pipeline.core) + _modules(pipeline.learn)
    assert len(mods) >= 15, mods
    assert _loaded_after_import(mods, ("ray",)) == []


def test_core_does_not_import_torch():
    assert _loaded_after_import(_modules(pipeline.core), ("ray", "torch")) == []
