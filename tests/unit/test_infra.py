"""infra/ is a specification too: manifests name real KubeRay fields, secrets come from Secrets,
the image follows the pinned Ray, and submit.sh builds the command the docs promise. No cluster."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
SUBMIT = INFRA / "submit.sh"

# Field names of the KubeRay ray.io/v1 CRDs (ray-operator/apis/ray/v1/rayjob_types.go and
# raycluster_types.go, KubeRay v1.7). A key outside these lists is a typo the API server would
# reject (strict field validation) or silently prune.
RAYJOB_SPEC_KEYS = {
    "activeDeadlineSeconds", "backoffLimit", "rayClusterSpec", "submitterPodTemplate",
    "metadata", "clusterSelector", "submitterConfig", "managedBy", "deletionStrategy",
    "entrypoint", "runtimeEnvYAML", "jobId", "submissionMode", "entrypointResources",
    "entrypointNumCpus", "entrypointNumGpus", "ttlSecondsAfterFinished",
    "preRunningDeadlineSeconds", "shutdownAfterJobFinishes", "suspend",
}  # fmt: skip
RAYCLUSTER_SPEC_KEYS = {
    "upgradeStrategy", "authOptions", "suspend", "managedBy", "autoscalerOptions",
    "headServiceAnnotations", "enableInTreeAutoscaling", "gcsFaultToleranceOptions",
    "historyServerOptions", "networkPolicy", "tlsOptions", "headGroupSpec", "rayVersion",
    "workerGroupSpecs",
}  # fmt: skip
HEAD_GROUP_KEYS = {
    "template", "headService", "enableIngress", "ingressOptions", "resources", "labels",
    "rayStartParams", "serviceType",
}  # fmt: skip
WORKER_GROUP_KEYS = {
    "suspend", "groupName", "replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds",
    "priority", "resources", "labels", "rayStartParams", "template", "scaleStrategy", "numOfHosts",
}  # fmt: skip
AUTH_OPTIONS_KEYS = {"mode", "secretName", "enableK8sTokenAuth"}

SECRET_ENV = ("WANDB_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "RAY_AUTH_TOKEN")

# Strings that look like credentials: AWS key ids, W&B keys (40 hex), GitHub / OpenAI style
# tokens, private keys, and any long value assigned to a secret-sounding name.
SECRET_PATTERNS = [
    re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\b[0-9a-f]{40}\b"),
    re.compile(r"\b(ghp|gho|ghs|github_pat|sk|xox[bp])[-_][A-Za-z0-9_]{20,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(
        r"(?i)(secret|token|api_?key|password|passwd)[\w-]*['\"]?\s*[:=]\s*['\"]?"
        r"(?!\$)[A-Za-z0-9/+=_-]{20,}"
    ),
]


def _yaml_docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _one(path: Path) -> dict:
    docs = _yaml_docs(path)
    assert len(docs) == 1, f"{path}: expected one document, got {len(docs)}"
    return docs[0]


def _pyproject_pin(name: str) -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        m = re.fullmatch(rf"{name}(\[[^\]]*\])?==([\w.]+)", dep.replace(" ", ""))
        if m:
            return m.group(2)
    raise AssertionError(f"pyproject.toml pins no {name}==X")


def _rayjob() -> dict:
    return _one(INFRA / "kuberay" / "rayjob.yaml")


def _raycluster() -> dict:
    return _one(INFRA / "kuberay" / "raycluster.yaml")


def _cluster_specs() -> list[tuple[str, dict]]:
    return [
        ("rayjob.yaml spec.rayClusterSpec", _rayjob()["spec"]["rayClusterSpec"]),
        ("raycluster.yaml spec", _raycluster()["spec"]),
    ]


def _ray_containers(cluster_spec: dict) -> list[dict]:
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


# ---------------------------------------------------------------- manifests


def test_every_manifest_parses():
    paths = sorted(INFRA.rglob("*.yaml"))
    assert {p.relative_to(INFRA).as_posix() for p in paths} >= {
        "cluster.yaml",
        "kuberay/raycluster.yaml",
        "kuberay/rayjob.yaml",
    }
    for p in paths:
        docs = _yaml_docs(p)
        assert docs and all(isinstance(d, dict) for d in docs), p


def test_kuberay_manifests_use_only_known_crd_fields():
    job = _rayjob()
    cluster = _raycluster()
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert set(job["spec"]) <= RAYJOB_SPEC_KEYS, set(job["spec"]) - RAYJOB_SPEC_KEYS
    for where, spec in _cluster_specs():
        assert set(spec) <= RAYCLUSTER_SPEC_KEYS, (where, set(spec) - RAYCLUSTER_SPEC_KEYS)
        assert set(spec["headGroupSpec"]) <= HEAD_GROUP_KEYS, where
        assert set(spec["authOptions"]) <= AUTH_OPTIONS_KEYS, where
        for g in spec["workerGroupSpecs"]:
            assert set(g) <= WORKER_GROUP_KEYS, (where, set(g) - WORKER_GROUP_KEYS)


def _rayjob_run_config():
    """The RunConfig the RayJob's entrypoint would train with: its config file plus its --set."""
    from pipeline.core.config import load_config

    words = shlex.split(_rayjob()["spec"]["entrypoint"])
    config = words[words.index("--config") + 1]
    overrides = [w for a, w in zip(words, words[1:], strict=False) if a == "--set"]
    return load_config(ROOT / config, overrides)


def test_rayjob_runs_training_and_resumes_on_retry():
    spec = _rayjob()["spec"]
    entry = spec["entrypoint"]
    assert entry.split()[:5] == "python -m jobs.train --config configs/dflash_902k.yaml".split()
    cfg = _rayjob_run_config()  # also proves every --set names a real field
    # A retry (backoffLimit) reruns this entrypoint: same storage and run name, so it resumes.
    assert "checkpoint.run_name=" in entry and "checkpoint.storage_path=" in entry
    assert cfg.checkpoint.storage_path.startswith("s3://")
    assert cfg.checkpoint.run_name
    # Every node reads the same data: a URI, not a node-local directory.
    assert cfg.data.path and cfg.data.path.startswith("s3://")
    assert spec["backoffLimit"] >= 1
    assert spec["shutdownAfterJobFinishes"] is True
    assert isinstance(spec["activeDeadlineSeconds"], int) and spec["activeDeadlineSeconds"] > 0
    # K8sJobMode: the submitter runs from our image, so a working_dir inside the image is uploadable.
    assert spec["submissionMode"] == "K8sJobMode"
    assert yaml.safe_load(spec["runtimeEnvYAML"])["working_dir"].startswith("/")
    assert spec["entrypointNumCpus"] > 0


def test_worker_groups_are_gpu_groups_with_bounds():
    for where, spec in _cluster_specs():
        assert len(spec["workerGroupSpecs"]) == 1, where
        g = spec["workerGroupSpecs"][0]
        assert g["groupName"]
        lo, hi = g["minReplicas"], g["maxReplicas"]
        assert 0 <= lo <= g.get("replicas", lo) <= hi, where
        for c in g["template"]["spec"]["containers"]:
            assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1, where


def _gpus_per_pod(group: dict) -> int:
    return sum(
        int(c["resources"]["limits"]["nvidia.com/gpu"])
        for c in group["template"]["spec"]["containers"]
    )


def test_rayjob_gpus_match_the_runs_workers():
    g = _rayjob()["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    cfg = _rayjob_run_config()
    # A training run needs all its workers at once: fixed size, one Train worker per GPU.
    assert g["minReplicas"] == g["replicas"] == g["maxReplicas"]
    assert cfg.scaling.use_gpu
    assert cfg.scaling.num_workers == g["replicas"] * _gpus_per_pod(g)
    cpus = sum(float(c["resources"]["limits"]["cpu"]) for c in g["template"]["spec"]["containers"])
    assert cfg.scaling.cpus_per_worker * _gpus_per_pod(g) <= cpus
    # The long-lived cluster can grow to the same run.
    g2 = _raycluster()["spec"]["workerGroupSpecs"][0]
    assert g2["maxReplicas"] * _gpus_per_pod(g2) >= cfg.scaling.num_workers


def test_token_auth_is_on_for_every_ray_process_and_the_submitter():
    ray_pin = _pyproject_pin("ray")
    for where, spec in _cluster_specs():
        assert spec["rayVersion"] == ray_pin, where
        assert spec["authOptions"]["mode"] == "token", where
        for c in _ray_containers(spec):
            env = _env(c)
            assert env["RAY_AUTH_MODE"]["value"] == "token", (where, c["name"])
            assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"], (where, c["name"])
    for c in _rayjob()["spec"]["submitterPodTemplate"]["spec"]["containers"]:
        assert _env(c)["RAY_AUTH_MODE"]["value"] == "token"
        assert "secretKeyRef" in _env(c)["RAY_AUTH_TOKEN"]["valueFrom"]


def test_wandb_and_aws_credentials_come_from_secrets():
    for where, spec in _cluster_specs():
        for c in _ray_containers(spec):
            env = _env(c)
            for name in SECRET_ENV:
                assert "value" not in env[name], (where, c["name"], name)
                ref = env[name]["valueFrom"]["secretKeyRef"]
                assert ref["name"] and ref["key"], (where, c["name"], name)


def _secret_hits(text: str) -> list[str]:
    return [m.group(0) for pat in SECRET_PATTERNS for m in pat.finditer(text)]


def test_secret_scan_catches_planted_keys():
    # Guards the next test against passing because the patterns match nothing.
    planted = [
        "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE",
        "aws_secret_access_key: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "WANDB_API_KEY=" + "0123456789abcdef" * 2 + "01234567",
        "value: " + "a1b2c3d4" * 5,
    ]
    for line in planted:
        assert _secret_hits(line), line
    assert not _secret_hits("secretKeyRef: {name: bucketray-aws, key: secret_access_key}")


def test_no_literal_secrets_in_infra():
    files = [p for p in INFRA.rglob("*") if p.is_file()] + [ROOT / ".dockerignore"]
    hits = {str(p.relative_to(ROOT)): h for p in files if (h := _secret_hits(p.read_text()))}
    assert not hits, f"credential-like strings in infra files: {hits}"


# ---------------------------------------------------------------- cluster launcher, image


def test_cluster_yaml_passes_rays_own_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((INFRA / "cluster.yaml").read_text())
    validate_config(prepare_config(raw))  # raises on unknown keys or wrong types
    assert raw["provider"]["type"] == "aws"
    workers = {k: v for k, v in raw["available_node_types"].items() if k != raw["head_node_type"]}
    assert len(workers) == 1, "one GPU worker type"
    (worker,) = workers.values()
    assert 0 <= worker["min_workers"] <= worker["max_workers"] <= raw["max_workers"]
    assert any("pip install" in c and "bucketray" in c for c in raw["setup_commands"])
    starts = raw["head_start_ray_commands"] + raw["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c)


def _dockerfile_base() -> str:
    froms = re.findall(r"(?im)^FROM\s+(\S+)", (INFRA / "Dockerfile").read_text())
    assert len(froms) == 1, froms
    return froms[0]


def test_image_tag_follows_pinned_ray_and_python():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = re.search(r">=\s*(\d+)\.(\d+)", requires).groups()
    expected = f"rayproject/ray:{_pyproject_pin('ray')}-py{major}{minor}-gpu"
    assert _dockerfile_base() == expected
    # The cluster launcher runs the same base image.
    assert yaml.safe_load((INFRA / "cluster.yaml").read_text())["docker"]["image"] == expected


def test_image_installs_project_with_pinned_torch():
    text = (INFRA / "Dockerfile").read_text()
    assert f"torch=={_pyproject_pin('torch')}" in text
    assert re.search(r"pip install [^\n]*\s\.(\s|$)", text), "the Dockerfile must `pip install .`"


def test_dockerignore_keeps_local_state_out_of_the_image():
    lines = {ln.strip().rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "data", "runs", "wandb"} <= lines


# ---------------------------------------------------------------- submit.sh


def _submit(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SUBMISSION_ID", "RUN_NAME", "NO_WAIT", "ENTRYPOINT")
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
