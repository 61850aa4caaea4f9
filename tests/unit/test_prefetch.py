"""The stream prepared ahead on a thread (`pipeline.train.prefetch`): the same micro-batches in
the same order, the producer's exception raised on the training thread, host work overlapping
the step, a clean stop, and the trainer's data wait still the training thread's own wait."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from pipeline.learn.logger import ListLogger
from pipeline.learn.loss import NonFiniteLossError
from pipeline.train.prefetch import Prefetcher, prefetch_batches
from tests.unit.trainer_fixtures import STEPS, Saver, batches_for, config, micro_batch, trainer


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "bucketray-prefetch" and t.is_alive()]


def _fields(mb) -> tuple:
    return (
        mb.epoch,
        mb.step,
        mb.bucket,
        mb.sample_ids.tolist(),
        *(getattr(mb, k).tolist() for k in ("input_ids", "attention_mask", "labels")),
        mb.position_ids.tolist(),
        mb.num_real_tokens,
        mb.num_padded_tokens,
    )


def test_the_same_micro_batches_in_the_same_order_with_and_without_prefetch():
    rng = np.random.default_rng(0)
    delays = rng.uniform(0, 0.01, size=2 * STEPS)

    def jittery(epoch):  # a producer whose pace varies
        for s in range(2 * STEPS):
            time.sleep(delays[s])
            yield micro_batch(epoch, s)

    for ahead in (1, 2, 5):
        plain = [_fields(mb) for mb in jittery(0)]
        with prefetch_batches(jittery(0), device=torch.device("cpu"), ahead=ahead) as it:
            got = [_fields(mb) for mb in it]
        assert got == plain
    assert not _prefetch_threads()


def test_an_exception_in_the_producer_is_raised_on_the_consumer_after_the_items_before_it():
    boom = ValueError("block 3 does not match the plan")

    def failing():
        yield from range(3)
        raise boom

    it = Prefetcher(failing(), ahead=2)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError) as e:
        next(it)
    assert e.value is boom  # the original error, its type and traceback
    assert "failing" in _frames(e.value.__traceback__)
    with pytest.raises(StopIteration):
        next(it)
    time.sleep(0.05)
    assert not _prefetch_threads()


def _frames(tb) -> list[str]:
    names = []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


def test_a_slow_producer_overlaps_a_slow_consumer():
    n, pause = 5, 0.2

    def slow():
        for i in range(n):
            time.sleep(pause)  # ray.get, padding, pinning
            yield i

    t0 = time.perf_counter()
    with Prefetcher(slow(), ahead=2) as it:
        for _ in it:
            time.sleep(pause)  # the step
    wall = time.perf_counter() - t0
    # In turn: 2.0 s; overlapped: about 1.2 s (the first item, then the steps).
    assert wall < 0.8 * 2 * n * pause, wall


def test_close_mid_stream_stops_the_thread_and_closes_the_stream():
    closed = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()  # where a stream drops its block references

    it = Prefetcher(endless(), ahead=2)
    assert next(it) == 0 and next(it) == 1
    it.close()
    assert closed.wait(2) and not _prefetch_threads()
    with pytest.raises(StopIteration):
        next(it)


def test_the_trainer_closes_the_stream_when_the_run_fails(tmp_path):
    t = trainer(tmp_path, config(tmp_path, max_nonfinite_steps=0), Saver(tmp_path))
    t.scheduler.base_lrs = [float("inf")] * len(t.scheduler.base_lrs)
    for group in t.optimizer.param_groups:
        group["lr"] = float("inf")
    with pytest.raises(NonFiniteLossError):
        t.fit(batches_for(), ListLogger())
    assert not _prefetch_threads()


def test_the_trainer_overlaps_the_stream_and_counts_only_its_own_wait(tmp_path):
    """A stream slower than the step: the trainer logs much of its time as waiting; a stream
    that keeps ahead of a slower step: almost none; both slow: they overlap."""

    def measured(stream_s: float, step_s: float) -> tuple[float, float]:
        d = tmp_path / f"{stream_s}-{step_s}"
        t = trainer(d, config(d, log_every=100), Saver(d))
        good, step = batches_for(), t.step

        def stream(epoch, start):
            for mb in good(epoch, start):
                time.sleep(stream_s)
                yield mb

        def slow_step(*a, **kw):
            time.sleep(step_s)
            return step(*a, **kw)

        t.step = slow_step
        log, t0 = ListLogger(), time.perf_counter()
        t.fit(stream, log)
        wall = time.perf_counter() - t0
        return [m for _, m in log.records if "data/wait_fraction" in m][-1][
            "data/wait_fraction"
        ], wall

    (waiting, _), (ahead, _) = measured(0.15, 0.0), measured(0.0, 0.15)
    assert waiting > 0.3 and ahead < 0.1 and waiting > 5 * ahead, (waiting, ahead)
    # Both slow: the stream's 0.1 s per micro-batch hides behind the step's 0.1 s (in turn the
    # 12 steps would take 2.4 s more than with neither; overlapped about 1.4 s).
    base, both = measured(0.0, 0.0)[1], measured(0.1, 0.1)[1]
    assert both - base < 0.85 * 2 * STEPS * 0.2, (base, both)
