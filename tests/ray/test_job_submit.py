"""`ray job submit` against a local head with token auth: the job trains and SUCCEEDS, and a
second submission with the same run name resumes from the first one's checkpoint."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

# The default suite submits through infra/submit.sh (tests/ray/test_submit_script.py); this
# module repeats it with the bare CLI and adds the resubmit-resumes case, so it runs in test-all.
pytestmark = [pytest.mark.ray, pytest.mark.slow]

# The head is `ray_head` (tests/ray/conftest.py): token auth on, its own ports and temp dir, stopped
# through its own process, never with `ray stop`, which ends every Ray instance on the machine.
REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
# Everything the job does not need stays out of the uploaded working dir.
EXCLUDES = [
    ".venv",
    ".git",
    "data",
    "runs",
    "wandb",
    "out",
    "tests",
    "**/__pycache__",
    "*.egg-info",
]


def _ray(head: dict, *args: str, check: bool = True, timeout: float = 600):
    """The `ray` CLI as a user runs it against the test's own head (its token, no RAY_ADDRESS)."""
    return subprocess.run(
        [RAY, *args],
        env={**head["env"], "RAY_ADDRESS": ""},
        cwd=REPO,
        capture_output=True,
        text=True,
        check=check,
        timeout=timeout,
    )


def _submit(head: dict, tmp: Path, max_steps: int) -> subprocess.CompletedProcess:
    overrides = [
        f"data.synthetic.out_dir={tmp / 'data'}",
        "data.synthetic.num_samples=300",
        "data.max_length=64",
        "model.d_model=32",
        "model.n_layers=1",
        "model.n_heads=2",
        "model.d_ff=64",
        "batching.token_budget=1024",
        "train.epochs=1",
        f"train.max_steps={max_steps}",
        # the second submission trains longer: its schedule continues the checkpoint's
        "train.on_schedule_change=keep",
        "train.log_every=5",
        "wandb.mode=disabled",
        f"checkpoint.storage_path={tmp / 'runs'}",
        "checkpoint.run_name=submitted",
    ]
    entry = [sys.executable, "-m", "jobs.train", "--config", "configs/local.yaml"]
    for o in overrides:
        entry += ["--set", o]
    runtime_env = json.dumps({"working_dir": ".", "excludes": EXCLUDES})
    return _ray(
        head,
        "job",
        "submit",
        "--address",
        head["address"],
        "--runtime-env-json",
        runtime_env,
        "--",
        *entry,
        check=False,
    )


def _job_id(out: str) -> str:
    m = re.search(r"Job '([^']+)' submitted successfully", out)
    assert m, out[-3000:]
    return m.group(1)


def test_submitted_job_trains_and_succeeds(ray_head, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("job")
    proc = _submit(ray_head, tmp, max_steps=10)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    status = _ray(ray_head, "job", "status", "--address", ray_head["address"], _job_id(out)).stdout
    assert f"Job '{_job_id(out)}' succeeded" in re.sub(r"\x1b\[[0-9;]*m", "", status), status
    assert "[bucketray] done: trained 10 global steps" in out, out[-4000:]
    assert list((tmp / "runs" / "submitted").glob("checkpoint_step00000010/state.json"))


@pytest.mark.slow
def test_resubmitted_job_continues_where_the_first_stopped(ray_head, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("job-resume")
    assert _submit(ray_head, tmp, max_steps=10).returncode == 0
    proc = _submit(ray_head, tmp, max_steps=15)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "resuming at epoch 0 step 10" in out and "trained 15 global steps" in out, out[-4000:]
