"""What the driver refuses before Ray starts or the index is built: a model no worker can
build, an unfinished tokenize output, a row cache directory it cannot write, a run directory
in use; and how a run interrupted while it is being prepared ends (one closing line)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import pipeline.train.launch as launch
from jobs import train as train_cli
from pipeline.core.config import ConfigError
from pipeline.data import DataError
from pipeline.learn.model_check import ModelBuildError, build_model_or_refuse, check_model
from pipeline.train.preflight import check_before_start
from pipeline.train.runlock import RunInUseError, RunLease
from tests.helpers import tiny_config, tiny_raw


def _hf(tmp_path, hf_config):
    return tiny_config(tmp_path, model={"name": "hf_causal_lm", "hf_config": hf_config}).model


@pytest.mark.parametrize(
    "hf_config,says",
    [
        ("missing/config.json", "no such local file"),
        ({"model_type": "lama", "hidden_size": 8}, "unknown model_type 'lama'"),
        ({"hidden_size": 8}, "needs a model_type"),
    ],
    ids=["missing-file", "unknown-type", "no-type"],
)
def test_a_model_no_worker_could_build_is_refused_on_the_driver(tmp_path, hf_config, says):
    with pytest.raises(ModelBuildError, match="model.hf_config") as e:
        check_model(_hf(tmp_path, hf_config))
    assert says in str(e.value) and isinstance(e.value, ConfigError)


def test_a_bad_json_hf_config_file_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelBuildError, match=r"config\.json is not valid JSON"):
        check_model(_hf(tmp_path, str(tmp_path)))


def test_a_model_that_fails_to_build_in_a_worker_is_a_config_error_naming_the_key(tmp_path):
    # what only building reveals: transformers' own check of the architecture
    cfg = _hf(tmp_path, {"model_type": "llama", "hidden_size": 8, "num_attention_heads": 3})
    with pytest.raises(ModelBuildError, match=r"^model\.hf_config: cannot build the model") as e:
        build_model_or_refuse(cfg, 64)
    assert "\n" not in str(e.value) and "not a multiple" in str(e.value)


def test_an_unfinished_tokenize_output_is_refused_naming_the_path(tmp_path):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "_bucketray_tokenize.json").write_text(json.dumps({"complete": False}))
    cfg = tiny_config(tmp_path, data={"path": str(out)})
    with pytest.raises(DataError, match=rf"data.path={out}: an incomplete jobs.tokenize output"):
        check_before_start(cfg)
    (out / "_bucketray_tokenize.json").write_text(json.dumps({"complete": True, "files": 1}))
    check_before_start(cfg)  # finished: fine


def test_an_unwritable_row_cache_dir_is_refused_before_ray(tmp_path):
    (tmp_path / "f").write_text("x")
    cfg = tiny_config(tmp_path, delivery={"row_cache_dir": str(tmp_path / "f" / "rows")})
    with pytest.raises(ConfigError, match=r"^delivery\.row_cache_dir="):
        check_before_start(cfg)


def _no_ray(monkeypatch, calls):
    def init_ray(address=None, **kw):
        calls.append("ray")
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(launch, "init_ray", init_ray)


def test_a_run_directory_in_use_is_refused_before_ray_starts(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path)
    fs, rdir = launch._run_fs(cfg)
    calls: list = []
    _no_ray(monkeypatch, calls)
    with RunLease(fs, rdir, settle_s=0.0):  # another live run of this name
        t0 = time.perf_counter()
        with pytest.raises(RunInUseError):
            launch.run(cfg)
    assert calls == [] and time.perf_counter() - t0 < 10


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_index_is_built_ends_with_one_closing_line(
    tmp_path, monkeypatch, capsys, sig
):
    import pipeline.data.driver as data

    monkeypatch.setattr(launch, "init_ray", lambda address=None, **kw: False)
    monkeypatch.setattr(launch, "_check_resources", lambda cfg, wait_s: None)
    monkeypatch.setattr(data, "resolve_data_path", lambda cfg: str(tmp_path))

    def index_build(cfg, path):
        os.kill(os.getpid(), sig)  # delivered while the index is being built
        time.sleep(5)
        raise AssertionError("the signal did not interrupt the index build")

    monkeypatch.setattr(data, "build_length_index", index_build)
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(tiny_raw(tmp_path)))

    # A handler left by someone else in the process (Ray, an embedding program) must not
    # swallow the signal while the run is prepared; it is back in place afterwards.
    def swallow(signum, frame):
        pass

    before = {s: signal.signal(s, swallow) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert train_cli.main(["--config", str(config)]) == 130
        assert signal.getsignal(sig) is swallow
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"[bucketray] interrupted by {signal.Signals(sig).name}")
    # and the lease was released on the way out
    fs, rdir = launch._run_fs(tiny_config(tmp_path))
    assert not os.path.exists(f"{rdir}/RUN_LEASE.json")
