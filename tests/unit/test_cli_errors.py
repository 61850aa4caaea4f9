"""The thin CLIs on mistakes: bad arguments are usage errors, and user errors in jobs.train are one
line with exit code 2."""

from __future__ import annotations

import pytest

from jobs import bench_data, measure_memory
from jobs import train as train_cli


def test_measure_memory_with_a_missing_config_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        measure_memory.main(["--config", str(tmp_path / "missing.yaml")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error:" in err and "missing.yaml" in err
    assert "Traceback" not in err


def test_bench_data_refuses_nonpositive_counts(capsys):
    with pytest.raises(SystemExit) as e:
        bench_data.main(["--num-samples", "0"])
    assert e.value.code == 2 and "--num-samples: 0 is not >= 1" in capsys.readouterr().err


def test_train_storage_oserror_is_one_line_and_debug_adds_the_traceback(monkeypatch, capsys):
    import pipeline.train.launch as launch

    def run(cfg, *, address=None, debug=False):
        raise PermissionError(13, "Permission denied", "/mnt/runs/bucketray-local")

    monkeypatch.setattr(launch, "run", run)
    assert train_cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: PermissionError: [Errno 13]")
    assert "/mnt/runs/bucketray-local" in err
    assert train_cli.main(["--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("error: PermissionError")


def test_train_unknown_config_key_is_one_line(capsys):
    assert train_cli.main(["--set", "train.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.lrr" in err
