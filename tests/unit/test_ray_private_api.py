"""The private Ray Train API pipeline/train/control.py relies on is still there. Ray may change
it in any release; this test is where an upgrade shows it, with what moved."""

from __future__ import annotations

import ray

from pipeline.train import control


def test_ray_private_api_the_driver_relies_on_is_present():
    problems = control.ray_private_api_problems()
    assert not problems, (
        f"Ray {ray.__version__}: the private Ray Train API in pipeline/train/control.py changed "
        f"({'; '.join(problems)}). Re-read ray/train/v2 for each entry of "
        "control.RAY_PRIVATE_API, adapt control.py, then update RAY_PRIVATE_API_CHECKED_WITH."
    )


def test_ray_version_is_the_one_the_private_api_was_checked_with():
    assert ray.__version__ == control.RAY_PRIVATE_API_CHECKED_WITH, (
        f"Ray {ray.__version__} is installed, the private API in pipeline/train/control.py was "
        f"checked with {control.RAY_PRIVATE_API_CHECKED_WITH}: re-check control.RAY_PRIVATE_API "
        "against the new release and update RAY_PRIVATE_API_CHECKED_WITH"
    )


def test_private_ray_imports_live_in_control_py_only():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    users = sorted(
        str(p.relative_to(root))
        for d in ("pipeline", "jobs", "examples")
        for p in (root / d).rglob("*.py")
        if "ray.train.v2._internal" in p.read_text()
        or "_initialize_and_run_controller" in p.read_text()
    )
    assert users == ["pipeline/train/control.py"], users


def test_the_check_reports_what_is_missing(monkeypatch):
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    monkeypatch.delattr(DataParallelTrainer, "_register_sigint_handler")
    assert any("_register_sigint_handler" in p for p in control.ray_private_api_problems())
