"""The image (infra/Dockerfile) and the cluster launcher config (infra/cluster.yaml): pinned base,
cache-friendly layers, Ray's own schema, and nodes that can reach the bucket. No Docker, no AWS."""

from __future__ import annotations

import re
import tomllib

import yaml

from tests.unit.test_infra import INFRA, ROOT, _pyproject_pin


def _launcher() -> dict:
    return yaml.safe_load((INFRA / "cluster.yaml").read_text())


def test_cluster_yaml_passes_rays_own_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = _launcher()
    validate_config(prepare_config(raw))  # raises on unknown keys or wrong types
    assert raw["provider"]["type"] == "aws"
    workers = {k: v for k, v in raw["available_node_types"].items() if k != raw["head_node_type"]}
    assert len(workers) == 1, "one GPU worker type"
    (worker,) = workers.values()
    assert 0 <= worker["min_workers"] <= worker["max_workers"] <= raw["max_workers"]
    starts = raw["head_start_ray_commands"] + raw["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c)


def test_every_launcher_node_has_an_instance_profile_and_a_chosen_ami():
    from ray.autoscaler._private.aws.config import DEFAULT_AMI

    for name, node_type in _launcher()["available_node_types"].items():
        nc = node_type["node_config"]
        # Workers too: rank 0 (on a worker) writes the checkpoints, every worker reads the data.
        arn = nc["IamInstanceProfile"]["Arn"]
        assert re.fullmatch(r"arn:aws:iam::[\w-]+:instance-profile/[\w+=,.@/-]+", arn), (name, arn)
        # Without an ImageId the launcher picks its built-in default, an old Ubuntu 18.04 AMI.
        ami = nc.get("ImageId", "")
        assert ami.lower() not in ("", "latest_dlami") and ami not in DEFAULT_AMI.values(), name
        assert re.fullmatch(r"ami-([0-9a-f]{8}|[0-9a-f]{17}|YOUR-[A-Z0-9-]+)", ami), (name, ami)


def _dockerfile() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (INFRA / "Dockerfile").read_text())
    return [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]


def _dockerfile_base() -> str:
    froms = [ln.split()[1] for ln in _dockerfile() if ln.upper().startswith("FROM ")]
    assert len(froms) == 1, froms
    return froms[0]


def test_image_base_pins_ray_python_and_cuda():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = re.search(r">=\s*(\d+)\.(\d+)", requires).groups()
    ray = re.escape(_pyproject_pin("ray"))
    # An exact CUDA tag (-cuXYZ), optionally with a digest; -gpu is an alias that moves.
    pattern = rf"rayproject/ray:{ray}-py{major}{minor}-cu\d{{3}}(@sha256:[0-9a-f]{{64}})?"
    assert re.fullmatch(pattern, _dockerfile_base()), _dockerfile_base()
    # The docs state the base they were checked against.
    assert _dockerfile_base() in (ROOT / "docs" / "cluster.md").read_text()


def test_dockerfile_installs_dependencies_before_copying_code():
    lines = _dockerfile()

    def first(pred) -> int:
        hits = [i for i, ln in enumerate(lines) if pred(ln)]
        assert hits, "infra/Dockerfile: no such instruction"
        return hits[0]

    # COPY's sources: its arguments without --flags and without the destination (the last one).
    copies = [
        (i, [a for a in ln.split()[1:-1] if not a.startswith("--")])
        for i, ln in enumerate(lines)
        if ln.upper().startswith("COPY ")
    ]
    copy_deps = first(lambda ln: ln.upper().startswith("COPY ") and "pyproject.toml" in ln)
    install_deps = first(lambda ln: ln.upper().startswith("RUN ") and "pyproject.toml" in ln)
    code = ("pipeline", "pipeline/", "jobs", "jobs/", ".", "./")
    copy_code = min(i for i, args in copies if any(a in code for a in args))
    # An edit to the code rebuilds only the layers after the dependencies.
    assert copy_deps < install_deps < copy_code, (copy_deps, install_deps, copy_code)
    assert "pip install" in lines[install_deps]
    # ...and the project install after the code does not touch the network for dependencies.
    (project,) = [ln for ln in lines[copy_code:] if re.search(r"pip install [^\n]*\s\.(\s|$)", ln)]
    assert "--no-deps" in project


def test_image_installs_the_pinned_torch_in_its_own_layer():
    lines = _dockerfile()
    torch = [i for i, ln in enumerate(lines) if f"torch=={_pyproject_pin('torch')}" in ln]
    assert torch, "the Dockerfile installs torch at the pyproject.toml pin"
    first_copy = next(i for i, ln in enumerate(lines) if ln.upper().startswith("COPY "))
    # Largest download, changes least: before anything copied, so no edit invalidates it.
    assert torch[0] < first_copy


def test_image_names_the_cuda_build_of_torch_and_the_docs_say_which_driver_it_needs():
    """PyPI's Linux torch 2.13.0 is the CUDA 13.0 build (driver >= 580); on an older driver
    torch reports no GPU. The image picks the build from PyTorch's index by a build argument,
    and docs/cluster.md names that default and its driver floor."""
    lines = _dockerfile()
    (arg,) = [ln for ln in lines if ln.startswith("ARG TORCH_CUDA=")]
    default = arg.split("=", 1)[1].strip()
    assert re.fullmatch(r"cu\d{3}", default), arg
    (install,) = [ln for ln in lines if f"torch=={_pyproject_pin('torch')}" in ln]
    assert "--index-url" in install and "download.pytorch.org/whl/${TORCH_CUDA}" in install
    docs = (ROOT / "docs" / "cluster.md").read_text()
    assert f"TORCH_CUDA={default}" in docs or f"`{default}`" in docs
    assert "580" in docs  # the driver a CUDA 13 torch needs


def test_dockerignore_keeps_local_state_out_of_the_image():
    lines = {ln.strip().rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "data", "runs", "wandb"} <= lines


def test_image_has_the_hf_extra_and_the_node_check():
    lines = _dockerfile()
    install = [ln for ln in lines if ln.upper().startswith("RUN ") and "pyproject.toml" in ln]
    # jobs.tokenize and model.name=hf_causal_lm import transformers and tokenizers.
    assert install and "optional-dependencies']['hf']" in install[0], install
    hf = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {d.split("==")[0] for d in hf["hf"]} >= {"transformers", "tokenizers"}
    # The node check ships in the image, at the path docs/cluster.md tells people to run.
    assert any(ln.upper().startswith("COPY ") and "scripts/check_node.sh" in ln for ln in lines)
    assert (ROOT / "scripts" / "check_node.sh").stat().st_mode & 0o111
