"""The thin CLIs on mistakes: a failed or trial benchmark leaves the tracked results alone, bad
arguments are usage errors, and user errors in jobs.train are one line with exit code 2."""

from __future__ import annotations

import json

import pytest

import jobs.benchmark as bench
from jobs import bench_data, measure_memory
from jobs import train as train_cli

OLD = '{"tracked": "results"}\n'


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A scratch working dir holding the tracked benchmark outputs, and a suite that renders
    without measuring."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "benchmarks").mkdir()
    for name in ("benchmarks/results.json", "BENCHMARKS.md", "benchmarks/headline.md"):
        (tmp_path / name).write_text(OLD)
    monkeypatch.setattr(bench, "plot_all", lambda results, folder: [])
    monkeypatch.setattr(bench, "render_markdown", lambda r, doc_path, json_path: "doc\n")
    monkeypatch.setattr(bench, "render_headline", lambda r, doc_path: "head")
    return tmp_path


def _unchanged(repo) -> bool:
    names = ("benchmarks/results.json", "BENCHMARKS.md", "benchmarks/headline.md")
    return all((repo / n).read_text() == OLD for n in names)


def test_a_failing_benchmark_run_leaves_the_tracked_results_alone(repo, monkeypatch):
    def run_suite(opts, *, command, log, save):
        save({"padding": "half done"})
        raise RuntimeError("section 2 failed")

    monkeypatch.setattr(bench, "run_suite", run_suite)
    with pytest.raises(RuntimeError, match="section 2"):
        bench.main([])
    assert _unchanged(repo)
    assert json.loads((repo / "benchmarks/results.json.partial").read_text())["padding"]


@pytest.mark.parametrize("flag", [["--quick"], ["--skip-training"], ["--train-repeats", "1"]])
def test_trial_runs_write_under_out_unless_told_where(repo, monkeypatch, flag):
    monkeypatch.setattr(bench, "run_suite", lambda opts, **kw: {"meta": {}})
    assert bench.main(flag) == 0
    assert _unchanged(repo)
    assert json.loads((repo / "out/bench-trial/results.json").read_text())["meta"] == {}
    assert (repo / "out/bench-trial/BENCHMARKS.md").read_text() == "doc\n"
    assert bench.main([*flag, "--json", "benchmarks/results.json"]) == 0  # asked for: written
    assert json.loads((repo / "benchmarks/results.json").read_text())["meta"] == {}


def test_a_full_run_writes_the_tracked_outputs(repo, monkeypatch):
    monkeypatch.setattr(bench, "run_suite", lambda opts, **kw: {"meta": {"full": True}})
    assert bench.main([]) == 0
    assert json.loads((repo / "benchmarks/results.json").read_text())["meta"] == {"full": True}
    assert not (repo / "benchmarks/results.json.partial").exists()


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
