"""Micro-batches made ready ahead of the step, on a thread of their own (no Ray).

A rank's stream does host work for every micro-batch: `ray.get` of its blocks, re-chunking,
padding, pinning (`pipeline.data.stream`, `pipeline.data.rechunk`). Done inline, the device idles
while the training thread builds the next batch. `Prefetcher` runs the stream on a background
thread up to `ahead` micro-batches before the training thread asks for them and, on CUDA, copies
each one's inputs to the device there, without blocking, on a side stream of its own; the
training thread's stream waits for that copy (an event, on the device) before using them.

- Order and contents are the stream's: one producer, one first-in first-out queue.
- An exception on the thread is raised on the training thread, the original object, when the
  training thread reaches that point of the stream (the micro-batches before it come first).
- `close()` (after the epoch, a stop, an exception) tells the thread to stop, drops what it made
  ahead, and closes the stream on the thread, which drops the stream's block references; a thread
  blocked in `ray.get` is waited for up to `CLOSE_WAIT_S`, then left to finish that call, after
  which it closes the stream itself (a daemon: it never holds the process open).
- The time the training thread waits in `next()` is the time it waited for data, which is what
  the trainer's `data/wait_fraction` measures.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from pipeline.train.step import device_inputs

__all__ = ["CLOSE_WAIT_S", "Prefetcher", "prefetch_batches"]

log = logging.getLogger("bucketray.train")

# How long close() waits for the thread (it may be inside a ray.get at a chapter boundary).
CLOSE_WAIT_S = 5.0
_POLL_S = 0.1  # how often a blocked put or get looks at the stop flag / the thread's life

_ITEM, _END, _ERROR = "item", "end", "error"


class Prefetcher(Iterator):
    """Iterate `source` on a background thread, at most `ahead` items before the consumer,
    each passed through `stage` on that thread (`stage` returns the item to hand out, and a
    function the consumer calls on it first, or None)."""

    def __init__(
        self,
        source: Iterable,
        *,
        ahead: int = 2,
        stage: Callable[[Any], tuple[Any, Callable[[Any], None] | None]] | None = None,
        name: str = "bucketray-prefetch",
    ):
        if ahead < 1:
            raise ValueError(f"ahead must be at least 1, got {ahead}")
        self._source = source
        self._stage = stage
        self._q: queue.Queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- the producer thread
    def _run(self) -> None:
        it = iter(self._source)
        try:
            for item in it:
                if self._stop.is_set():
                    return
                staged = self._stage(item) if self._stage else (item, None)
                if not self._put((_ITEM, staged)):
                    return
            self._put((_END, None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, who raises it
            self._put((_ERROR, e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()  # a generator's locals (its Ray block refs) go now
                except Exception:  # noqa: BLE001 - the run is over for this stream anyway
                    log.warning("closing the prefetched stream failed", exc_info=True)

    def _put(self, entry: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    # ---- the consumer (training) thread
    def __next__(self):
        if self._done:
            raise StopIteration
        while True:
            try:
                kind, value = self._q.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._q.empty():
                    self._done = True
                    raise RuntimeError("the prefetch thread ended without a word") from None
        if kind == _END:
            self._done = True
            raise StopIteration
        if kind == _ERROR:
            self._done = True
            self.close()
            raise value
        item, ready = value
        if ready is not None:
            ready(item)
        return item

    def close(self) -> None:
        """Stop the thread, drop what it made ahead; safe to call more than once."""
        self._done = True
        self._stop.set()
        self._drain()
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT_S)
            if self._thread.is_alive():
                log.warning(
                    "the prefetch thread is still inside its stream after %.0f s; it stops "
                    "after that call",
                    CLOSE_WAIT_S,
                )
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                return

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cuda_stage(device: torch.device):
    """Copy a micro-batch's inputs to `device` on a side stream; the consumer's stream waits
    for that copy and marks the tensors as used by it (the allocator then keeps them)."""
    side = torch.cuda.Stream(device)

    def stage(mb):
        with torch.cuda.device(device), torch.cuda.stream(side):
            x = device_inputs(mb, device)
            done = torch.cuda.Event()
            done.record(side)
        return dataclasses.replace(mb, staged=x), lambda m: _ready(m, device, done)

    return stage


def _ready(mb, device: torch.device, done) -> None:
    main = torch.cuda.current_stream(device)
    main.wait_event(done)  # on the device: the host does not wait
    for t in mb.staged.values():
        t.record_stream(main)


def prefetch_batches(source: Iterable, *, device: torch.device, ahead: int = 2) -> Prefetcher:
    """`source`'s micro-batches built `ahead` ahead on a thread; on CUDA with their inputs
    already on `device` (`MicroBatch.staged`)."""
    stage = _cuda_stage(device) if device.type == "cuda" else None
    return Prefetcher(source, ahead=ahead, stage=stage)
