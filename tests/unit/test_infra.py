"""infra/ is a specification too: the KubeRay manifests name real fields of the operator the docs
require, secrets come from Secrets, every node runs one image and sees the run's storage. No
cluster. The image and cluster launcher: test_infra_image.py; submit.sh: test_infra_submit.py."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"

# Field names of the KubeRay ray.io/v1 CRDs in operator v1.6.0, the oldest operator the manifests
# support (docs/cluster.md). A key outside these lists is a typo, or a field that operator does not
# know: the API server rejects it (strict field validation) or silently prunes it.
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
    "headGroupSpec", "rayVersion", "workerGroupSpecs",
}  # fmt: skip
HEAD_GROUP_KEYS = {
    "template", "headService", "enableIngress", "resources", "labels", "rayStartParams",
    "serviceType",
}  # fmt: skip
WORKER_GROUP_KEYS = {
    "suspend", "groupName", "replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds",
    "resources", "labels", "rayStartParams", "template", "scaleStrategy", "numOfHosts",
}  # fmt: skip
AUTH_OPTIONS_KEYS = {"mode", "secretName", "enableK8sTokenAuth"}
AUTOSCALER_OPTIONS_KEYS = {
    "env", "envFrom", "idleTimeoutSeconds", "image", "imagePullPolicy", "resources",
    "securityContext", "upscalingMode", "version", "volumeMounts",
}  # fmt: skip

# The operator release that introduced each field the manifests may rely on beyond the basics
# (read from the CRD types of each release). The documented minimum must cover every one used.
FIELD_SINCE = {
    "spec.authOptions": (1, 5, 1),
    "spec.authOptions.secretName": (1, 6, 0),
    "spec.authOptions.enableK8sTokenAuth": (1, 6, 0),
    "spec.preRunningDeadlineSeconds": (1, 6, 0),
}
# How docs/cluster.md and the manifests' headers state the minimum operator.
OPERATOR_MIN = re.compile(r"KubeRay(?:\s+operator)?\s*>=\s*v?(\d+)\.(\d+)\.(\d+)")

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
        assert set(spec.get("autoscalerOptions", {})) <= AUTOSCALER_OPTIONS_KEYS, where
        for g in spec["workerGroupSpecs"]:
            assert set(g) <= WORKER_GROUP_KEYS, (where, set(g) - WORKER_GROUP_KEYS)


def _fields_used() -> set[str]:
    used = set()
    for _, spec in [("rayjob", _rayjob()["spec"]), *_cluster_specs()]:
        used |= {f"spec.{k}" for k in spec}
        used |= {f"spec.authOptions.{k}" for k in spec.get("authOptions", {})}
    return used & set(FIELD_SINCE)


def test_documented_operator_version_covers_the_fields_used():
    needed = max(FIELD_SINCE[f] for f in _fields_used())
    stated = {
        str(p.relative_to(ROOT)): {tuple(map(int, m)) for m in OPERATOR_MIN.findall(p.read_text())}
        for p in [ROOT / "docs" / "cluster.md", *sorted((INFRA / "kuberay").glob("*.yaml"))]
    }
    # One minimum, stated in the docs and in every manifest's header, and new enough for the
    # fields in use (secretName and preRunningDeadlineSeconds: v1.6.0; older operators prune
    # them, and the RayJob would then neither find its token nor ever time out).
    assert all(len(v) == 1 for v in stated.values()), stated
    versions = {v for vs in stated.values() for v in vs}
    assert len(versions) == 1, stated
    (minimum,) = versions
    assert minimum >= needed, (minimum, needed, _fields_used())


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


def test_rayjob_gives_up_on_a_stuck_start_and_frees_the_gpus_soon_after():
    spec = _rayjob()["spec"]
    # A cluster that never gets its GPUs, an image that never pulls, or a submitter that never
    # submits fails the attempt in bounded time instead of waiting until activeDeadlineSeconds.
    pre = spec["preRunningDeadlineSeconds"]
    assert isinstance(pre, int) and 0 < pre <= 3600 and pre < spec["activeDeadlineSeconds"]
    # The finished job's cluster (8 GPUs) is deleted within a minute or two, not after 10.
    assert spec["shutdownAfterJobFinishes"] is True
    assert 0 <= spec["ttlSecondsAfterFinished"] <= 120


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
            ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
            # The same Secret the operator reads (it sends the token to the dashboard with it).
            assert (ref["name"], ref["key"]) == (spec["authOptions"]["secretName"], "auth_token")
    for c in _rayjob()["spec"]["submitterPodTemplate"]["spec"]["containers"]:
        assert _env(c)["RAY_AUTH_MODE"]["value"] == "token"
        assert "secretKeyRef" in _env(c)["RAY_AUTH_TOKEN"]["valueFrom"]


def test_autoscaler_sidecar_gets_the_token_itself():
    # The sidecar runs the head's image, whose ENV turns token auth on; it must not depend on the
    # operator injecting the token (operators without authOptions, or with it removed, do not).
    autoscaled = [(w, s) for w, s in _cluster_specs() if s.get("enableInTreeAutoscaling")]
    assert autoscaled, "no manifest runs the autoscaler: this test would check nothing"
    for where, spec in autoscaled:
        env = {e["name"]: e for e in spec["autoscalerOptions"]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token", where
        assert "value" not in env["RAY_AUTH_TOKEN"], where
        ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (spec["authOptions"]["secretName"], "auth_token")


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


# ---------------------------------------------------------------- where the run's files live


def _path_strings(node) -> list[str]:
    """Every string in a config subtree that names a location (a URI or a path), at any depth."""
    if isinstance(node, dict):
        return [p for v in node.values() for p in _path_strings(v)]
    if isinstance(node, list):
        return [p for v in node for p in _path_strings(v)]
    return [node] if isinstance(node, str) and ("/" in node or node.startswith("~")) else []


SHARED_VOLUME_TYPES = {"persistentVolumeClaim", "nfs", "csi", "ephemeral"}


def _shared_mounts() -> set[str]:
    """Mount paths of shared volumes that every pod of BOTH KubeRay manifests mounts."""
    per_pod = []
    for _, spec in _cluster_specs():
        for g in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
            pod = g["template"]["spec"]
            shared = {v["name"] for v in pod.get("volumes", []) if set(v) & SHARED_VOLUME_TYPES}
            per_pod.append(
                {
                    m["mountPath"].rstrip("/")
                    for c in pod["containers"]
                    for m in c.get("volumeMounts", [])
                    if m["name"] in shared
                }
            )
    return set.intersection(*per_pod)


def _seen_by_every_node(location: str, mounts: set[str]) -> bool:
    scheme = location.split("://")[0] if "://" in location else None
    if scheme is not None:
        return scheme in ("s3", "gs")
    return any(location == m or location.startswith(m + "/") for m in mounts)


def test_team_config_names_only_storage_every_node_sees():
    # Read generically (any key, any depth under data and checkpoint), so a reshaped config
    # section is still checked: every location must be a bucket URI or a shared volume that the
    # manifests mount on every pod. A node-local path works on one machine only: the driver
    # would find the data and the workers would not, or rank 0 would save where nobody resumes.
    raw = yaml.safe_load((ROOT / "configs" / "dflash_902k.yaml").read_text())
    mounts = _shared_mounts()
    data = _path_strings(raw["data"])
    assert data, "configs/dflash_902k.yaml names no data location"
    for section in ("data", "checkpoint"):
        for loc in _path_strings(raw.get(section, {})):
            assert _seen_by_every_node(loc, mounts), (
                f"configs/dflash_902k.yaml {section}: {loc!r} is neither an s3:// or gs:// URI "
                f"nor under a shared volume the KubeRay manifests mount (shared mounts: {mounts})"
            )


def test_location_check_refuses_node_local_paths():
    assert not _seen_by_every_node("/mnt/cluster_storage/x", set())
    assert not _seen_by_every_node("data/seed902k", {"/mnt/shared"})
    assert not _seen_by_every_node("file:///tmp/x", set())
    assert _seen_by_every_node("s3://bucket/x", set())
    assert _seen_by_every_node("/mnt/shared/x", {"/mnt/shared"})
    assert _path_strings({"a": {"b": ["s3://b/x", 3, "token"]}, "c": "~/x"}) == ["s3://b/x", "~/x"]


# ---------------------------------------------------------------- one image everywhere


def _images() -> dict[str, str]:
    """Every container image the KubeRay manifests and the cluster launcher run."""
    images = {}
    for where, spec in _cluster_specs():
        for c in _ray_containers(spec):
            images[f"{where} {c['name']}"] = c["image"]
    for c in _rayjob()["spec"]["submitterPodTemplate"]["spec"]["containers"]:
        images[f"rayjob.yaml submitter {c['name']}"] = c["image"]
    images["cluster.yaml docker.image"] = yaml.safe_load((INFRA / "cluster.yaml").read_text())[
        "docker"
    ]["image"]
    return images


def test_every_node_runs_the_one_project_image():
    images = _images()
    assert len(set(images.values())) == 1, images
    assert not next(iter(images.values())).startswith("rayproject/"), "the project image, not Ray's"
    # The image holds the dependencies: no node reinstalls torch or the project at start-up.
    raw = yaml.safe_load((INFRA / "cluster.yaml").read_text())
    keys = ("initialization_commands", "setup_commands", "head_setup_commands",
            "worker_setup_commands")  # fmt: skip
    commands = [c for k in keys for c in raw.get(k) or []]
    assert not [c for c in commands if "pip install" in c or "torch" in c], commands


# ---------------------------------------------------------------- the 2 x 8 layout

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}


def _bytes(quantity) -> int:
    """A Kubernetes quantity ("34Gi", "512Mi", "1000000") in bytes."""
    m = re.fullmatch(r"(\d+)([KMGT]i|[kMGT])?", str(quantity))
    assert m, f"not a byte quantity: {quantity!r}"
    return int(m.group(1)) * _UNITS.get(m.group(2) or "", 1)


def _groups(spec: dict) -> list[dict]:
    return [spec["headGroupSpec"], *spec["workerGroupSpecs"]]


def _volume(pod: dict, mount_path: str, container: dict) -> dict:
    (name,) = [m["name"] for m in container.get("volumeMounts", []) if m["mountPath"] == mount_path]
    (vol,) = [v for v in pod["volumes"] if v["name"] == name]
    return vol


def _stop_wait_s() -> int:
    env = yaml.safe_load(_rayjob()["spec"]["runtimeEnvYAML"]).get("env_vars", {})
    assert "RAY_JOB_STOP_WAIT_TIME_S" in env, "the RayJob keeps Ray's 3 s stop wait"
    value = env["RAY_JOB_STOP_WAIT_TIME_S"]
    assert isinstance(value, str) and value.isdigit(), value  # runtime-env values are strings
    return int(value)


def test_rayjob_gives_a_stop_the_time_of_a_graceful_checkpoint():
    import inspect

    from pipeline.train.stop import stop_poller

    wait = _stop_wait_s()
    poll = inspect.signature(stop_poller).parameters["poll_s"].default
    # Rank 0 notices the stop within one poll, then the ranks finish their step and write one
    # checkpoint to S3: minutes, not Ray's 3 s default (docs/cluster.md, "Stopping a run").
    assert wait >= 60 * poll, (wait, poll)
    # A deleted pod keeps its processes for its grace period: longer than the stop wait, or the
    # pod dies before the checkpoint is written.
    for g in _groups(_rayjob()["spec"]["rayClusterSpec"]):
        assert g["template"]["spec"]["terminationGracePeriodSeconds"] > wait, g.get("groupName")


def test_rayjob_is_two_nodes_of_eight_gpus_with_room_for_workers_and_data():
    from pipeline.train.preflight import DATA_CPUS

    spec = _rayjob()["spec"]["rayClusterSpec"]
    (g,) = spec["workerGroupSpecs"]
    cfg = _rayjob_run_config()
    assert (g["replicas"], _gpus_per_pod(g), cfg.scaling.num_workers) == (2, 8, 16)
    (c,) = g["template"]["spec"]["containers"]
    limits, requests = c["resources"]["limits"], c["resources"]["requests"]
    assert limits == requests, "guaranteed QoS: nothing of a training pod is overcommitted"
    # Eight workers' CPUs plus more than the one Ray Data needs at least.
    assert float(limits["cpu"]) >= 8 * cfg.scaling.cpus_per_worker + 2 * DATA_CPUS
    # /dev/shm: memory-backed, holding the object store and NCCL's buffers, inside the pod's memory.
    for group in _groups(spec):
        pod = group["template"]["spec"]
        (cont,) = pod["containers"]
        shm = _volume(pod, "/dev/shm", cont)["emptyDir"]
        assert shm["medium"] == "Memory", group.get("groupName")
        store = int(group["rayStartParams"]["object-store-memory"])
        assert _bytes(shm["sizeLimit"]) >= store + 2**30, group.get("groupName")
        assert _bytes(shm["sizeLimit"]) < _bytes(cont["resources"]["limits"]["memory"])
    assert _bytes(_volume(g["template"]["spec"], "/dev/shm", c)["emptyDir"]["sizeLimit"]) >= (
        int(g["rayStartParams"]["object-store-memory"]) + 8 * 2**30
    ), "room for NCCL beside the object store on a GPU node"


def _custom_resources(group: dict) -> dict:
    raw = group.get("rayStartParams", {}).get("resources")
    return json.loads(json.loads(raw)) if raw else {}  # KubeRay wants a quoted JSON string


def test_driver_feeder_and_row_cache_are_placed_on_the_data_node():
    from pipeline.core.synthetic import seed902k_lengths
    from pipeline.data.rowcache import MIN_FREE_BYTES

    job = _rayjob()["spec"]
    wanted = json.loads(job["entrypointResources"])
    assert wanted, "the driver (and the feeder pinned to its node) would land anywhere"
    holders = [
        g for g in _groups(job["rayClusterSpec"]) if set(wanted) <= set(_custom_resources(g))
    ]
    assert holders == [job["rayClusterSpec"]["headGroupSpec"]], (
        "exactly one node offers it: the head"
    )
    pod = holders[0]["template"]["spec"]
    (c,) = pod["containers"]
    assert "nvidia.com/gpu" not in c["resources"]["limits"], "the data node holds no GPU"
    # The row cache goes to a volume of its own on that node, sized from the corpus: 4 B per
    # token, and the fill keeps max(2 GiB, 5%) of the disk free.
    rows = _rayjob_run_config().delivery.row_cache_dir
    assert rows and rows.startswith("/"), rows
    vol = _volume(pod, rows, c)
    size = _bytes(vol["emptyDir"]["sizeLimit"])
    need = 4 * int(seed902k_lengths(902_087).sum())
    assert size - need >= max(MIN_FREE_BYTES, size // 20), (size, need)
    # The scheduler only places the pod where that disk is free when the pod asks for it.
    assert _bytes(c["resources"]["requests"]["ephemeral-storage"]) > size
    # The long-lived cluster and the launcher mark their head the same way (infra/submit.sh
    # places the driver with ENTRYPOINT_RESOURCES).
    assert set(wanted) <= set(_custom_resources(_raycluster()["spec"]["headGroupSpec"]))
    launcher = yaml.safe_load((INFRA / "cluster.yaml").read_text())
    head = launcher["available_node_types"][launcher["head_node_type"]]
    assert set(wanted) <= set(head["resources"])
