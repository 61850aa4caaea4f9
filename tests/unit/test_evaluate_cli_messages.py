"""jobs.evaluate's one-line refusals say what is wrong and the fix, before Ray starts."""

from __future__ import annotations

from jobs import evaluate as evaluate_job


def test_a_run_directory_that_does_not_exist_is_named_as_such(tmp_path, capsys):
    assert evaluate_job.main([str(tmp_path / "runs" / "nope")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "no complete checkpoint" not in err, err
    assert "checkpoint.storage_path" in err and "run_name" in err, err
    # An existing folder without checkpoints keeps its own message.
    (tmp_path / "empty").mkdir()
    assert evaluate_job.main([str(tmp_path / "empty")]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err
