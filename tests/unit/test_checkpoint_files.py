"""Reading a checkpoint from remote storage (contract 7): two ranks on one node resume from the
same s3:// checkpoint at once, and neither may rewrite the files the other is reading."""

import pickle
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray.train
import torch

from pipeline.learn.checkpoint import checkpoint_files

PAYLOAD = {"w": torch.arange(100_000, dtype=torch.float32)}


@pytest.fixture
def remote(tmp_path) -> tuple[ray.train.Checkpoint, Path]:
    """A checkpoint on a filesystem that is not pyarrow's LocalFileSystem, as s3:// is not."""
    (tmp_path / "store" / "ckpt").mkdir(parents=True)
    torch.save(PAYLOAD, tmp_path / "store" / "ckpt" / "optimizer.pt")
    (tmp_path / "store" / "ckpt" / "run_config.json").write_text("{}")
    fs = pafs.SubTreeFileSystem(str(tmp_path / "store"), pafs.LocalFileSystem())
    return ray.train.Checkpoint("ckpt", filesystem=fs), tmp_path


def test_contract7_ranks_on_one_node_read_a_remote_checkpoint_each_from_its_own_copy(remote):
    ckpt, _ = remote
    # Each rank receives the checkpoint pickled: the same object, as Ray Train hands it out.
    rank0, rank1 = (pickle.loads(pickle.dumps(ckpt)) for _ in range(2))
    with checkpoint_files(rank1) as d1:
        mine = Path(d1) / "optimizer.pt"
        mine.write_bytes(b"what rank 1 is reading")  # stands for a read in progress
        with checkpoint_files(rank0) as d0:
            assert d0 != d1
            assert torch.equal(torch.load(Path(d0) / "optimizer.pt")["w"], PAYLOAD["w"])
        # Rank 0 came and went: rank 1's files were neither rewritten nor removed under it.
        assert mine.read_bytes() == b"what rank 1 is reading"
    assert not Path(d1).exists() and not Path(d0).exists(), "a private copy was left behind"


def test_a_reader_of_some_files_of_a_remote_checkpoint_copies_only_those(remote):
    """An evaluation reads the weights and the config, never the optimizer's state."""
    ckpt, _ = remote
    with checkpoint_files(ckpt, ["run_config.json"]) as d:
        assert sorted(p.name for p in Path(d).iterdir()) == ["run_config.json"]
        assert (Path(d) / "run_config.json").read_text() == "{}"


def test_rays_shared_download_directory_rewrites_a_readers_files(remote):
    """Why checkpoint_files exists: Ray's as_directory hands every rank of a node one directory,
    and a later rank downloads into it again. If Ray stops doing that, this test says so."""
    ckpt, _ = remote
    with ckpt.as_directory() as d:
        mine = Path(d) / "optimizer.pt"
        mine.write_bytes(b"what rank 1 is reading")
        pickle.loads(pickle.dumps(ckpt)).to_directory()  # a second rank of the node arrives
        assert mine.read_bytes() != b"what rank 1 is reading"


def test_a_local_checkpoint_is_read_in_place_and_kept(tmp_path):
    (tmp_path / "ckpt").mkdir()
    torch.save(PAYLOAD, tmp_path / "ckpt" / "optimizer.pt")
    with checkpoint_files(ray.train.Checkpoint.from_directory(tmp_path / "ckpt")) as d:
        assert Path(d) == tmp_path / "ckpt"
    assert (tmp_path / "ckpt" / "optimizer.pt").is_file()
