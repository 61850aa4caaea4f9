"""The pure core imports no Ray: plans, edges, collation and metric math are testable anywhere."""

from __future__ import annotations

import subprocess
import sys

PURE = [
    "config", "buckets", "plan", "collate", "metrics", "report", "synthetic",
    "loss", "optim", "model", "checkpoint", "epochs", "corpus", "logger",
]  # fmt: skip


def test_pure_modules_do_not_import_ray():
    code = (
        "import sys\n"
        + "".join(f"import pipeline.{m}\n" for m in PURE)
        + "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
