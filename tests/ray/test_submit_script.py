"""infra/submit.sh against a real, token-authenticated local Ray head: the job is accepted with
the token, refused without it, sees the repository as its working dir minus the excludes, gets
the config and --set arguments unchanged, and reaches SUCCEEDED; a training job with a relative
checkpoint.storage_path (which would resolve inside the job's content-hashed working dir, so a
resubmission would not resume) FAILS at once with one line naming the key.

Run as a module (`python -m tests.ray.test_submit_script ...`) this file is also the job's
entrypoint: it reports what the job saw, as one JSON line, for the test to check.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import http_status

ROOT = Path(__file__).resolve().parents[2]
SUBMIT = ROOT / "infra" / "submit.sh"
REPORT_PREFIX = "SUBMIT_PROBE "
# Present in a checkout, and listed in submit.sh's excludes: the job must not see them.
EXCLUDED = (".venv", ".git", "data", "runs", "wandb")

pytestmark = pytest.mark.ray


def _submit(ray_head, config: str, *args: str, timeout: float, **extra_env: str):
    env = {**ray_head["env"], "RAY_ADDRESS": ray_head["address"], **extra_env}
    return subprocess.run(
        ["bash", str(SUBMIT), config, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _job_status(ray_head, submission_id: str) -> str:
    """The job's status from the Jobs SDK, in a child process so RAY_AUTH_* stays out of ours."""
    code = (
        "import sys; from ray.job_submission import JobSubmissionClient as C; "
        "print(C(sys.argv[1]).get_job_status(sys.argv[2]).value)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, ray_head["address"], submission_id],
        env=ray_head["env"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return res.stdout.strip().splitlines()[-1]


def test_jobs_api_refuses_requests_without_the_token(ray_head):
    assert http_status(f"{ray_head['address']}/api/jobs/", None) == 401
    assert http_status(f"{ray_head['address']}/api/jobs/", "not-the-token") in (401, 403)


def test_submitted_job_sees_repo_and_arguments_and_succeeds(ray_head):
    # Any repository file works as CONFIG here: the probe entrypoint only checks it arrived.
    config = "pyproject.toml"
    sets = ["--set", "train.max_steps=3", "--set", "checkpoint.run_name=submit-probe"]
    sid = f"submit-probe-{secrets.token_hex(4)}"
    t0 = time.monotonic()
    res = _submit(
        ray_head,
        config,
        *sets,
        timeout=240,
        SUBMISSION_ID=sid,
        ENTRYPOINT=f"python -m tests.ray.{Path(__file__).stem}",
        ENTRYPOINT_NUM_CPUS="0.5",
    )
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert _job_status(ray_head, sid) == "SUCCEEDED"
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith(REPORT_PREFIX))
    seen = json.loads(line.removeprefix(REPORT_PREFIX))
    assert seen["argv"] == ["--config", config, *sets]
    assert seen["config_is_file"]
    assert seen["excluded_present"] == []
    assert seen["auth_mode"] == "token"
    assert seen["in_submitted_job"]  # so a relative path is refused (test_driver_checks.py)
    print(f"submit.sh round trip: {elapsed:.1f}s")


@pytest.mark.slow  # a whole training job (1-2 min): make test-all; make test submits the other two
@pytest.mark.skipif(
    not (ROOT / "jobs" / "train.py").exists() or not (ROOT / "configs" / "local.yaml").exists(),
    reason="jobs/train.py and configs/local.yaml not in the tree yet",
)
def test_tiny_training_run_through_submit_succeeds(ray_head, tmp_path):
    sid = f"submit-train-{secrets.token_hex(4)}"
    sets = {
        "train.max_steps": "3",
        "train.log_every": "1",
        "scaling.num_workers": "1",
        "scaling.cpus_per_worker": "0.5",
        "wandb.mode": "disabled",
        "data.synthetic.num_samples": "256",
        "data.synthetic.shards": "2",
        "batching.token_budget": "8192",
        "model.d_model": "32",
        "model.n_layers": "1",
        "model.n_heads": "2",
        "model.d_ff": "64",
        # Every location absolute: inside a submitted job a relative one is refused.
        "data.synthetic.out_dir": str(tmp_path / "data"),
        "checkpoint.storage_path": str(tmp_path / "runs"),
        "checkpoint.run_name": sid,
    }
    args = [w for k, v in sets.items() for w in ("--set", f"{k}={v}")]
    res = _submit(
        ray_head,
        "configs/local.yaml",
        *args,
        timeout=480,
        SUBMISSION_ID=sid,
        ENTRYPOINT_NUM_CPUS="0.5",
    )
    assert res.returncode == 0, f"{res.stdout[-4000:]}\n{res.stderr[-2000:]}"
    assert _job_status(ray_head, sid) == "SUCCEEDED"


# A whole failed job (~20 s): make test-slow. The default suite keeps the refusal itself
# (test_driver_checks.py) and that a submitted job is recognised as one (the probe above).
@pytest.mark.slow
def test_relative_storage_path_fails_the_job_with_one_line(ray_head):
    sid = f"submit-relative-{secrets.token_hex(4)}"
    res = _submit(
        ray_head,
        "configs/local.yaml",
        "--set",
        "data.synthetic.out_dir=/tmp/bucketray-never-written",
        "--set",
        "checkpoint.storage_path=runs",
        "--set",
        "wandb.mode=disabled",
        timeout=300,
        SUBMISSION_ID=sid,
        ENTRYPOINT_NUM_CPUS="0.5",
    )
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert _job_status(ray_head, sid) == "FAILED"
    # One line (the CLI tails the job's logs, and prints them again when it fails).
    errors = {ln for ln in res.stdout.splitlines() if ln.startswith("error:")}
    assert len(errors) == 1, out[-3000:]
    assert errors.pop().startswith("error: checkpoint.storage_path='runs' is relative"), out[-3000:]
    assert "Traceback" not in res.stdout, out[-3000:]


def _probe() -> None:
    """Entrypoint of the probe job: what did the job get?"""
    from pipeline.train.preflight import in_submitted_job

    argv = sys.argv[1:]
    config = argv[argv.index("--config") + 1] if "--config" in argv else ""
    report = {
        "argv": argv,
        "config_is_file": bool(config) and Path(config).is_file(),
        "excluded_present": [p for p in EXCLUDED if Path(p).exists()],
        "auth_mode": os.environ.get("RAY_AUTH_MODE"),
        # What the driver's relative-path refusal keys on (pipeline.train.preflight).
        "in_submitted_job": in_submitted_job(),
    }
    print(REPORT_PREFIX + json.dumps(report), flush=True)


if __name__ == "__main__":
    _probe()
