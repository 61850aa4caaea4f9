"""infra/submit.sh builds the `ray job submit` command docs/cluster.md promises. No cluster."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBMIT = ROOT / "infra" / "submit.sh"


def _submit(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "SUBMISSION_ID",
            "RUN_NAME",
            "NO_WAIT",
            "ENTRYPOINT",
            "STOP_WAIT_S",
            "ENTRYPOINT_RESOURCES",
        )
    }
    full_env.update(env)
    return subprocess.run(
        ["bash", str(SUBMIT), *args], capture_output=True, text=True, env=full_env, timeout=30
    )


def _dry_run_argv(*args: str, **env: str) -> list[str]:
    res = _submit(*args, DRY_RUN="1", **env)
    assert res.returncode == 0, res.stderr
    return shlex.split(res.stdout)


# Any file in the repository serves as CONFIG for a dry run: only its existence is checked.
CONFIG = "pyproject.toml"


def test_submit_script_syntax():
    subprocess.run(["bash", "-n", str(SUBMIT)], check=True)


def test_submit_dry_run_prints_the_full_command():
    sets = ["--set", "train.max_steps=3", "--set", "checkpoint.run_name=smoke"]
    argv = _dry_run_argv(CONFIG, *sets)
    assert argv[:3] == ["ray", "job", "submit"]
    opts, entry = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    assert opts[opts.index("--address") + 1] == "http://127.0.0.1:8265"
    assert opts[opts.index("--working-dir") + 1] == "."
    assert float(opts[opts.index("--entrypoint-num-cpus") + 1]) > 0
    assert re.fullmatch(r"smoke-\d{8}T\d{6}Z", opts[opts.index("--submission-id") + 1])
    excludes = json.loads(opts[opts.index("--runtime-env-json") + 1])["excludes"]
    for d in ("data/", "runs/", "wandb/", ".venv/", ".git"):
        assert any(d in e for e in excludes), d
    assert "--no-wait" not in opts
    assert entry == ["python", "-m", "jobs.train", "--config", CONFIG, *sets]


def test_submit_overrides_from_environment():
    argv = _dry_run_argv(
        CONFIG,
        SUBMISSION_ID="fixed-id",
        RAY_ADDRESS="http://head:8265",
        NO_WAIT="1",
        ENTRYPOINT="python -c print(1)",
        ENTRYPOINT_NUM_CPUS="0.5",
    )
    assert argv[argv.index("--submission-id") + 1] == "fixed-id"
    assert argv[argv.index("--address") + 1] == "http://head:8265"
    assert argv[argv.index("--entrypoint-num-cpus") + 1] == "0.5"
    assert "--no-wait" in argv
    assert argv[argv.index("--") + 1 :] == ["python", "-c", "print(1)", "--config", CONFIG]


def test_submit_refuses_a_missing_config():
    res = _submit("configs/does_not_exist.yaml", DRY_RUN="1")
    assert res.returncode != 0
    assert "config not found" in res.stderr


def test_submit_refuses_to_run_without_a_token(tmp_path):
    env = {"HOME": str(tmp_path), "RAY_AUTH_TOKEN": "", "RAY_AUTH_TOKEN_PATH": ""}
    res = _submit(CONFIG, **env)
    assert res.returncode != 0
    assert "no Ray auth token" in res.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_submit_script_is_shellcheck_clean():
    subprocess.run(["shellcheck", str(SUBMIT)], check=True)


def test_submit_gives_the_job_a_stop_wait_and_can_place_the_driver():
    def runtime_env(argv):
        return json.loads(argv[argv.index("--runtime-env-json") + 1])

    argv = _dry_run_argv(CONFIG)
    # Ray's default is 3 s of grace after SIGTERM: far too short for a step plus a checkpoint.
    assert int(runtime_env(argv)["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]) >= 120
    assert "--entrypoint-resources" not in argv  # any node, unless asked
    argv = _dry_run_argv(CONFIG, STOP_WAIT_S="900", ENTRYPOINT_RESOURCES='{"bucketray_data": 1}')
    assert runtime_env(argv)["env_vars"] == {"RAY_JOB_STOP_WAIT_TIME_S": "900"}
    assert json.loads(argv[argv.index("--entrypoint-resources") + 1]) == {"bucketray_data": 1}
    res = _submit(CONFIG, DRY_RUN="1", STOP_WAIT_S="10m")
    assert res.returncode == 2 and "STOP_WAIT_S" in res.stderr
