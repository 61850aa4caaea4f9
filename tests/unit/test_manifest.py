"""Per-shard digests: a refused resume names the shards whose samples changed."""

import numpy as np
import pytest

from pipeline.core.manifest import describe_changes, file_digests
from pipeline.learn.checkpoint import DataPosition, ResumeError, check_resume

FILES = ["/d/a.parquet", "/d/sub/b.parquet", "/d/c.parquet"]


def _digests(ids, lens, fidx):
    return file_digests(FILES, "/d", np.array(fidx), np.array(ids), np.array(lens))


def test_digests_are_per_shard_relative_and_order_free():
    d = _digests([1, 2, 3, 4], [5, 6, 7, 8], [0, 1, 0, 1])
    assert sorted(d) == ["a.parquet", "c.parquet", "sub/b.parquet"]
    # The index sorts by sample id, not by file: the same samples give the same digests.
    assert d == _digests([1, 3, 2, 4], [5, 7, 6, 8], [0, 0, 1, 1])
    assert d["c.parquet"] == _digests([9], [1], [0])["c.parquet"]  # a shard with no samples


def test_a_changed_length_or_id_changes_only_its_shard():
    base = _digests([1, 2, 3, 4], [5, 6, 7, 8], [0, 1, 0, 1])
    longer = _digests([1, 2, 3, 4], [5, 6, 7, 9], [0, 1, 0, 1])
    assert describe_changes(base, longer) == "changed: sub/b.parquet"
    fewer = _digests([1, 2, 3], [5, 6, 7], [0, 1, 0])
    assert describe_changes(base, fewer) == "changed: sub/b.parquet"
    assert describe_changes(base, base) == ""


def test_added_removed_and_many_changed_shards_are_named_or_counted():
    old = {f"s{i}": "x" for i in range(6)}
    new = {**{f"s{i}": "y" for i in range(5)}, "t": "x"}
    assert describe_changes(old, new) == ("changed: s0, s1, s2 and 2 more; added: t; removed: s5")


def _position(files):
    return DataPosition(0, 3, "old-hash", 2, {"k": 1}, 3, files)


def test_check_resume_names_the_changed_shard():
    with pytest.raises(ResumeError, match=r"\(changed: a\.parquet\)"):
        check_resume(
            _position({"a.parquet": "1", "b.parquet": "2"}),
            global_batch={"k": 1},
            plan_hash="new-hash",
            world_size=2,
            on_world_size_change="refuse",
            data_files={"a.parquet": "9", "b.parquet": "2"},
        )


def test_a_checkpoint_without_digests_still_loads_and_is_refused_plainly():
    d = _position({}).to_dict()
    del d["data_files"]  # written before per-shard digests were recorded
    p = DataPosition.from_dict(d)
    assert p.data_files == {}
    with pytest.raises(ResumeError) as e:
        check_resume(
            p,
            global_batch={"k": 1},
            plan_hash="new-hash",
            world_size=2,
            on_world_size_change="refuse",
            data_files={"a.parquet": "9"},
        )
    assert "changed:" not in str(e.value) and "plan hash" in str(e.value)
