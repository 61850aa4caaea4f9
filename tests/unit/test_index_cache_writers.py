"""The index cache under concurrent writers: each writes its own temporary file, so two runs
filling the same cache at once both succeed and neither warns."""

from __future__ import annotations

import logging
import threading

import pyarrow as pa
import pyarrow.parquet as pq

import pipeline.data.cache as cache


def test_concurrent_writers_of_the_index_cache_use_their_own_temporary_names(
    tmp_path, monkeypatch, caplog
):
    table = pa.table({"x": list(range(100))})
    both_writing = threading.Barrier(2, timeout=10)
    real_write, written = pq.write_table, []

    def write_table(t, where, **kw):  # both writers are mid-write at the same moment
        real_write(t, where, **kw)
        written.append(where)
        both_writing.wait()

    monkeypatch.setattr(cache.pq, "write_table", write_table)
    with caplog.at_level(logging.WARNING, "bucketray.data"):
        runs = [threading.Thread(target=cache.save_cache, args=(str(tmp_path), "fp", table))]
        runs.append(threading.Thread(target=cache.save_cache, args=(str(tmp_path), "fp", table)))
        for r in runs:
            r.start()
        for r in runs:
            r.join()
    assert len(set(written)) == 2  # two temporary names
    assert "could not cache" not in caplog.text
    assert cache.load_cached(str(tmp_path), "fp").equals(table)
    assert [p.name for p in tmp_path.iterdir()] == ["index-fp.parquet"]  # no temporary left
