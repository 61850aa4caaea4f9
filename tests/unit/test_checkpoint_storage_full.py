"""A checkpoint the storage refuses for good (disk full) ends the run in one line naming
checkpoint.storage_path, and leaves no partial checkpoint a resume could pick up."""

from __future__ import annotations

import errno

import pyarrow.fs as pafs
import pytest

from pipeline.learn.checkpoint import CheckpointStorageError
from pipeline.train import loop
from pipeline.train.control import is_deterministic


class _Storage:
    def __init__(self, root):
        self.storage_filesystem, self.root = pafs.LocalFileSystem(), root

    def build_checkpoint_path_from_name(self, name):
        return f"{self.root}/{name}"


def test_disk_full_while_checkpointing_names_the_storage_path_and_leaves_no_partial(
    tmp_path, monkeypatch
):
    import ray.train

    run_dir = tmp_path / "runs" / "r"
    storage = _Storage(str(run_dir))

    def report(metrics, checkpoint, checkpoint_dir_name):  # the copy stops half-way
        partial = run_dir / checkpoint_dir_name
        partial.mkdir(parents=True)
        (partial / "model.pt").write_bytes(b"\0" * 1024)
        raise OSError(errno.ENOSPC, "No space left on device", str(partial / "optimizer.pt"))

    monkeypatch.setattr(ray.train, "report", report)
    monkeypatch.setattr(
        ray.train, "get_context", lambda: type("C", (), {"get_storage": lambda s: storage})()
    )
    (tmp_path / "local").mkdir()
    with pytest.raises(CheckpointStorageError) as e:
        loop._report(str(tmp_path / "local"), {}, "checkpoint_step00000010", storage_path="/runs")
    msg = str(e.value)
    assert msg.startswith(
        "checkpoint.storage_path=/runs: cannot write checkpoint checkpoint_step00000010"
    )
    assert "No space left on device" in msg and "\n" not in msg
    assert is_deterministic(e.value)  # not retried
    assert not (run_dir / "checkpoint_step00000010").exists()


def test_a_transient_storage_error_while_checkpointing_is_left_to_ray_train(tmp_path, monkeypatch):
    import ray.train

    def report(metrics, checkpoint, checkpoint_dir_name):
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    monkeypatch.setattr(ray.train, "report", report)
    (tmp_path / "local").mkdir()
    with pytest.raises(ConnectionResetError):
        loop._report(str(tmp_path / "local"), {}, "checkpoint_step00000010", storage_path="/runs")
