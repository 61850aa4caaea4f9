"""What a start and each micro-batch cost, beyond the work itself: how reads decode, which
threads yield the CPU, what the C allocator keeps, what a lead-in imports.

Each was a measured cost on 2 cores: reads queued on a Ray worker's one Arrow thread, padding
paid a page fault per 4 KB written, a lead-in waited for Ray Data's import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from pipeline.data.read import (
    BACKGROUND_NICE,
    ReadSpec,
    background_priority,
    in_background,
    read_row_group,
)
from pipeline.data.retry import RetryPolicy
from pipeline.data.scan import READ_BATCH_ROWS, ContentDigest, input_ids_digest

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice and glibc")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python(code: str) -> str:
    """Run `code` in a fresh interpreter (process-wide settings stay out of this one)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_row_groups_decode_in_batches_on_the_calling_thread_and_narrow_as_they_go(
    tmp_path, monkeypatch
):
    """A read decodes its row group batch by batch on its own thread and keeps only planned
    rows of each batch: whole row groups decoded at once cost ~1.8x the CPU, and a Ray
    worker's Arrow pool (OMP_NUM_THREADS threads, often 1) would queue parallel reads."""
    n = 3 * READ_BATCH_ROWS + 17
    rng = np.random.default_rng(0)
    lens = rng.integers(0, 9, n)
    ids = [rng.integers(0, 50, k).tolist() for k in lens]
    path = str(tmp_path / "a.parquet")
    whole = pa.table({"sample_id": pa.array(np.arange(n) + 100, pa.int64()), "input_ids": ids})
    pq.write_table(whole, path)
    digest = input_ids_digest(pq.read_table(path)["input_ids"])
    seen = []
    real = pq.ParquetFile.iter_batches

    def spy(self, batch_size=65536, row_groups=None, columns=None, use_threads=True, **kw):
        seen.append((batch_size, use_threads))
        for b in real(self, batch_size, row_groups, columns, use_threads, **kw):
            seen.append(b.num_rows)
            yield b

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    spec = ReadSpec(
        (path,), (True,), "", None, 50, RetryPolicy(attempts=1, backoff_s=0.0), ((digest,),)
    )
    for rows in (np.arange(n), np.array([0, 5, READ_BATCH_ROWS, n - 1]), np.array([n - 2])):
        seen.clear()
        t, _ = read_row_group(
            pafs.LocalFileSystem(), spec, 0, 0, rows, rows, rows + 100, lens[rows]
        )
        assert t["input_ids"].to_pylist() == [ids[i] for i in rows]
        assert t["sample_id"].to_pylist() == (rows + 100).tolist()
        assert seen == [(READ_BATCH_ROWS, False), *[READ_BATCH_ROWS] * 3, 17]


def test_a_row_group_digest_is_the_same_for_any_batching():
    """Delivery hashes a row group batch by batch; the scan's digest of it is the same, and a
    change of one token, one length or one row's validity changes it."""
    rng = np.random.default_rng(1)
    ids = [None if k < 0 else rng.integers(0, 99, k).tolist() for k in rng.integers(-1, 7, 300)]
    ids[3] = [1, None, 2]  # a null token
    arr = pa.array(ids, pa.list_(pa.int32()))
    whole = input_ids_digest(arr)
    for size in (1, 7, 64, 299, 300):
        d = ContentDigest(arr.type.value_type)
        for lo in range(0, len(arr), size):
            d.update(pa.array(ids[lo : lo + size], arr.type))  # fresh arrays, offsets from 0
        assert d.hexdigest() == whole
    d = ContentDigest(arr.type.value_type)
    d.update(pa.chunked_array([arr.slice(0, 100), arr.slice(100)]))  # slices keep offsets
    assert d.hexdigest() == whole
    moved = [list(x) if x is not None else None for x in ids]
    i = next(k for k, x in enumerate(moved) if x and len(x) > 1 and None not in x)
    moved[i][0] += 1
    other = [
        moved,
        ids[:i] + [ids[i][:-1]] + ids[i + 1 :],
        ids[:-1] + [[]] if ids[-1] is None else ids[:-1] + [None],
    ]
    for changed in other:
        assert input_ids_digest(pa.array(changed, arr.type)) != whole


@linux_only
def test_preparation_threads_run_at_background_priority():
    """The feeder's preparation and read threads yield the CPU to the streams (per thread)."""
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with ThreadPoolExecutor(2, initializer=background_priority) as pool:
        nice = pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        assert nice.result() == max(main, BACKGROUND_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main


@linux_only
def test_a_read_task_yields_the_cpu_without_renicing_the_worker_it_runs_in():
    """Ray Data read tasks run in workers that later run other tasks: the read runs on a thread
    of its own at background priority, the worker's thread keeps its priority."""
    tid = lambda: threading.get_native_id()  # noqa: E731
    main = os.getpriority(os.PRIO_PROCESS, tid())
    assert in_background(lambda: os.getpriority(os.PRIO_PROCESS, tid())) == max(
        main, BACKGROUND_NICE
    )
    assert os.getpriority(os.PRIO_PROCESS, tid()) == main
    with pytest.raises(ValueError, match="bad row"):
        in_background(lambda: (_ for _ in ()).throw(ValueError("bad row")))


@linux_only
def test_padding_keeps_freed_memory_instead_of_faulting_it_back():
    """Micro-batch after micro-batch, padding reuses the memory it freed: without
    keep_freed_memory glibc hands it back to the kernel and every micro-batch faults it in."""
    code = """
        import resource, sys
        import numpy as np
        from pipeline.core.collate import collate
        from pipeline.data.rechunk import keep_freed_memory
        if sys.argv[1] == "keep":
            assert keep_freed_memory()
        rng = np.random.default_rng(0)
        lens = rng.integers(700, 800, 40)
        off = np.concatenate([[0], np.cumsum(lens)])
        vals = rng.integers(0, 512, off[-1]).astype(np.int32)
        for _ in range(20):
            collate(vals, off, upper=800)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(200):
            out = collate(vals, off, upper=800)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200)
    """
    script = textwrap.dedent(code)

    def faults(mode):
        env = dict(os.environ, PYTHONPATH=ROOT)
        out = subprocess.run(
            [sys.executable, "-c", script, mode], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return float(out.stdout.strip())

    kept, default = faults("keep"), faults("default")
    # ~1 MB written per micro-batch: ~250 pages, each one a fault when the memory went back
    assert kept < 5, (kept, default)
    assert default > 10 * max(kept, 1), (kept, default)


# Two fresh interpreters and a Ray start (~25 s): make test-slow; a start-up cost, not a contract.
@pytest.mark.slow
def test_a_lead_in_never_imports_ray_data(tmp_path):
    """The first range is read in the feeder; Ray Data (~0.6 s to import here) waits for the
    first chapter sorted through it."""
    setup = f"""
        import sys
        from pipeline.core.config import RunConfig
        from pipeline.data.corpus import write_corpus
        from pipeline.core.epochs import resolve_edges
        from pipeline.data.feeder import Feeder
        from pipeline.data.index import build_length_index
        write_corpus({str(tmp_path)!r}, num_samples=200, shards=2, vocab_size=64, progress=False)
        cfg = RunConfig.model_validate({{
            "data": {{"path": {str(tmp_path)!r}, "cache_dir": {str(tmp_path / "c")!r}}},
            "model": {{"vocab_size": 64}},
        }})
        index = build_length_index(cfg)  # the scan is a Ray Data pass; a cached index is not
    """
    _python(setup)  # as the driver does, once: the index cached
    feeder = """
        Feeder(cfg.model_dump(mode="json"), index, resolve_edges(cfg, index.lengths),
               cfg.data.path)
        print("ray.data" in sys.modules)
    """
    assert _python(setup + feeder) == "False"
