"""The driver's checks before a run starts, without Ray: which cluster it joins, paths that must
outlive a submitted job's working directory, resources against the cluster, truncation."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from pipeline.core.config import ConfigError, load_config
from pipeline.data.connect import check_reachable, resolve_address
from pipeline.train.preflight import (
    DATA_CPUS,
    SUBMITTED_JOB_ENV,
    check_stable_paths,
    preflight,
)


def _cfg(*overrides: str):
    return load_config("configs/local.yaml", list(overrides))


def _dead_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- address


def test_no_address_means_a_private_local_instance_never_none():
    assert resolve_address(None, {}) == "local"
    assert resolve_address(None, {"RAY_ADDRESS": ""}) == "local"


def test_ray_address_set_by_job_submit_is_joined_and_a_flag_wins():
    assert resolve_address(None, {"RAY_ADDRESS": "10.0.0.5:6379"}) == "10.0.0.5:6379"
    assert resolve_address("auto", {"RAY_ADDRESS": "10.0.0.5:6379"}) == "auto"


def test_a_dead_address_fails_fast_with_one_line():
    addr = f"127.0.0.1:{_dead_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        check_reachable(addr, timeout_s=5)
    assert time.monotonic() - t0 < 30  # a bound, not a timing figure: ray.init waits minutes
    msg = str(e.value)
    assert "\n" not in msg and addr in msg and "RAY_ADDRESS" in msg


def test_an_address_without_a_port_is_refused():
    with pytest.raises(ConfigError, match="host:port"):
        check_reachable("http://somewhere", timeout_s=1)


# --------------------------------------------------------------------------- stable paths


def test_relative_storage_path_is_refused_inside_a_submitted_job():
    cfg = _cfg("data.synthetic.out_dir=/tmp/x", "checkpoint.storage_path=runs")
    with pytest.raises(ConfigError) as e:
        check_stable_paths(cfg, {SUBMITTED_JOB_ENV: "{}"})
    msg = str(e.value)
    assert "\n" not in msg
    assert "checkpoint.storage_path='runs' is relative" in msg and "absolute path" in msg


def _absolute(tmp_path, *overrides: str):
    """configs/local.yaml with every location absolute, then `overrides`."""
    return _cfg(
        f"data.synthetic.out_dir={tmp_path / 'data'}",
        f"checkpoint.storage_path={tmp_path / 'runs'}",
        *overrides,
    )


def test_relative_paths_are_fine_outside_a_job_and_absolute_or_uri_inside(tmp_path):
    check_stable_paths(_cfg("checkpoint.storage_path=runs"), {})
    job = {SUBMITTED_JOB_ENV: "{}"}
    check_stable_paths(_absolute(tmp_path), job)
    check_stable_paths(_absolute(tmp_path, "checkpoint.storage_path=s3://bkt/runs"), job)
    check_stable_paths(_absolute(tmp_path, "delivery.row_cache_dir=~/rows"), job)


# Every location a config can name: the fields marked PATH. A new location field joins the
# rule by its mark; this list says which ones exist, so one dropped by mistake shows here.
LOCATIONS = {
    "data.path": "shards",
    "data.cache_dir": "idx",
    "data.quarantine_path": "q.parquet",
    "delivery.row_cache_dir": "rows",
    "train.metrics_file": "m.jsonl",
    "train.record_sample_ids": "ids",
    "wandb.dir": "wandb",
    "checkpoint.storage_path": "runs",
    "model.hf_pretrained": "model",
}


def _every_location_set(tmp_path) -> list[str]:
    """Overrides that set every location to an absolute path (data.path run first: it replaces
    the synthetic section; the synthetic out_dir is checked on its own)."""
    return [f"{k}={tmp_path / v}" for k, v in LOCATIONS.items()] + [
        "model.name=hf_causal_lm",
        "data.on_bad_rows=quarantine",  # where data.quarantine_path is used
    ]


def test_path_fields_lists_every_location_the_config_can_name(tmp_path):
    from pipeline.core.config import path_fields

    cfg = _cfg(*_every_location_set(tmp_path))
    assert {k for k, _ in path_fields(cfg)} == set(LOCATIONS)
    assert [k for k, _ in path_fields(_cfg())] == [
        "data.synthetic.out_dir",
        "checkpoint.storage_path",
    ]


# Set on their own: the synthetic corpus excludes data.path, hf_config excludes hf_pretrained.
ALONE = {
    "data.synthetic.out_dir": ["checkpoint.storage_path={tmp}"],
    "model.hf_config": ["data.synthetic.out_dir={tmp}", "checkpoint.storage_path={tmp}",
                        "model.name=hf_causal_lm"],
}  # fmt: skip


@pytest.mark.parametrize("key", [*LOCATIONS, *ALONE])
def test_every_relative_location_is_refused_inside_a_job(key, tmp_path):
    sets = (
        [s.format(tmp=tmp_path) for s in ALONE[key]]
        if key in ALONE
        else _every_location_set(tmp_path)
    )
    cfg = _cfg(*sets, f"{key}=out/x")
    with pytest.raises(ConfigError) as e:
        check_stable_paths(cfg, {SUBMITTED_JOB_ENV: "{}"})
    assert str(e.value).startswith(f"{key}='out/x' is relative"), str(e.value)
    check_stable_paths(cfg, {})  # outside a job: resolved against the current directory


def test_every_field_that_describes_a_location_is_marked_as_one():
    """A str field whose description speaks of a path, directory, file or URI must carry the PATH
    mark, or the relative-path rule would silently skip it."""
    import typing

    from pydantic import BaseModel

    from pipeline.core.config import RunConfig

    words = ("path", "directory", " dir", "file", "uri", "folder")
    # Fields that mention such words without naming a location.
    not_locations = {"DataConfig.glob", "DataConfig.split", "CheckpointConfig.run_name",
                     "ModelConfig.name", "SyntheticConfig.preset", "EvalConfig.split"}  # fmt: skip
    seen, unmarked = set(), []

    def models(tp) -> list[type[BaseModel]]:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return [tp]
        return [m for a in typing.get_args(tp) for m in models(a)]

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, info in model.model_fields.items():
            for sub in models(info.annotation):
                walk(sub)
            text = (info.description or "").lower()
            is_str = str in typing.get_args(info.annotation) or info.annotation is str
            marked = (info.json_schema_extra or {}).get("path")
            where = f"{model.__name__}.{name}"
            if (
                is_str
                and any(w in text for w in words)
                and not marked
                and where not in not_locations
            ):
                unmarked.append(where)

    walk(RunConfig)
    assert len(seen) > 8, seen  # the walk reached the sections, variants included
    assert not unmarked, f"location fields without json_schema_extra=PATH: {unmarked}"


# --------------------------------------------------------------------------- resources


def test_workers_leaving_ray_data_no_cpu_are_refused_with_the_numbers():
    # 12 packed rows per step divide among 3 workers (and 2 to 4 below)
    cfg = _cfg("scaling.num_workers=3", "scaling.cpus_per_worker=0.5", "batching.rows_per_step=12")
    with pytest.raises(ConfigError) as e:
        preflight({"CPU": 2.0}, cfg)
    assert str(e.value).startswith(
        "3 workers x 0.5 CPU + 1 CPU for Ray Data = 2.5 CPU > 2 in the cluster: lower "
        "scaling.num_workers"
    )


def test_too_many_workers_are_refused_and_a_fitting_run_passes():
    with pytest.raises(ConfigError, match="8 workers x 0.5 CPU"):
        preflight({"CPU": 2.0}, _cfg("scaling.num_workers=8"))
    preflight({"CPU": 2.0}, _cfg())  # the local default: 2 x 0.5 + 1 = 2
    assert DATA_CPUS == 1.0


def test_gpus_and_custom_resources_are_checked_and_elastic_uses_min_workers():
    with pytest.raises(ConfigError, match="2 workers x 1 GPU = 2 GPU > 1"):
        preflight({"CPU": 16, "GPU": 1}, _cfg("scaling.use_gpu=true"))
    with pytest.raises(ConfigError, match="fast_disk"):
        preflight({"CPU": 16}, _cfg("scaling.resources_per_worker={fast_disk: 1}"))
    elastic = _cfg("scaling.num_workers=4", "scaling.min_workers=2", "batching.rows_per_step=12")
    preflight({"CPU": 2.0}, elastic)


def test_an_autoscaling_cluster_without_a_published_maximum_is_not_refused():
    preflight({"CPU": 2.0}, _cfg("scaling.num_workers=8"), autoscaling=True)


# --------------------------------------------------------------------------- truncation


def test_run_start_line_on_truncation():
    from types import SimpleNamespace

    from pipeline.train.resume_check import truncation_note

    clipped = np.array([10, 512, 512, 300], dtype=np.int32)
    assert truncation_note(SimpleNamespace(truncate_to=None, lengths=clipped)) is None
    note = truncation_note(SimpleNamespace(truncate_to=512, lengths=clipped))
    assert (
        note
        == "data.over_length=truncate: 2 samples reach the top edge 512 (cut or exactly 512 long)"
    )
    raw = np.array([10, 600, 512, 300], dtype=np.int32)
    note = truncation_note(
        SimpleNamespace(truncate_to=512, lengths=clipped, untruncated_lengths=raw)
    )
    assert note == "truncating 1 samples at the top edge 512: 88 tokens cut (6.19% of 1,422)"
    from pipeline.train.resume_check import truncation_metrics

    index = SimpleNamespace(truncate_to=512, lengths=clipped, untruncated_lengths=raw)
    assert truncation_metrics(index) == {
        "epoch/truncated_samples": 1,
        "epoch/truncated_tokens": 88,
    }
    assert truncation_metrics(SimpleNamespace(truncate_to=None, untruncated_lengths=None)) == {}
