"""A private local Ray that does not come up (its processes not registered in Ray's 30 s on a
machine under load) ends the run in one line saying what to do, exit 2, not Ray's traceback."""

from __future__ import annotations

import json

import pytest
import ray

from jobs import train as train_cli
from pipeline.data.connect import RayStartError, connect
from tests.helpers import tiny_raw

RAY_SAYS = (
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


@pytest.fixture
def ray_cannot_start(monkeypatch):
    calls = {"init": 0, "shutdown": 0}

    def init(**kw):
        calls["init"] += 1
        raise Exception(RAY_SAYS)  # what ray/_private/node.py raises

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.__setitem__("shutdown", 1))
    return calls


def test_a_local_ray_that_times_out_starting_is_one_line_with_what_to_do(ray_cannot_start):
    with pytest.raises(RayStartError) as e:
        connect("local")
    msg = str(e.value)
    assert msg.startswith("local Ray did not start (The current node timed out during startup")
    assert "run again" in msg and "ray start --head" in msg and "\n" not in msg
    assert ray_cannot_start == {"init": 1, "shutdown": 1}  # what half started is stopped


def test_jobs_train_ends_a_ray_that_cannot_start_with_exit_2(ray_cannot_start, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(tiny_raw(tmp_path)))
    assert train_cli.main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: local Ray did not start") and err.count("\n") == 1
    assert "Traceback" not in err


def test_other_errors_of_ray_init_are_not_dressed_up(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def init(**kw):
        raise RuntimeError("something else")

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(RuntimeError, match="something else"):
        connect("local")
