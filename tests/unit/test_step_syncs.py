"""At most one host-device synchronisation per optimizer step, counted on the CPU.

The CPU has no device to synchronise with, so the count follows the tensors a GPU run keeps on
its device: the model's parameters, anything moved with `.to(device)` or made with `device=`
naming the trainer's device object (torch's own `device="cpu"`, as the optimizer's step count,
is the host), and anything computed from those ("device tensors"). A read of a device tensor on the host --
`.item()`, `float()`, `int()`, `bool()` (all `aten._local_scalar_dense`), `.cpu()`, `.numpy()`,
`.tolist()`, a copy into a host tensor -- is what waits for the device on a GPU, and is counted.
Checkpoints (which read every weight) are not counted. The GPU's own count of the same steps is
`tests/gpu/test_gpu_syncs.py` (CUDA's sync debug mode)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pipeline.learn.logger import ListLogger
from tests.unit.trainer_fixtures import STEPS, Saver, batches_for, config, trainer

_MARK = "_on_training_device"
_HOST_READS = {torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist}


def _on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _MARK, False)


def _mark(out, on: bool = True):
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            setattr(t, _MARK, on)
    return out


class _Moves(TorchFunctionMode):
    """Python-level calls: `.to(device)` copies a host tensor to the device (emulated by a
    copy), `device=` makes a device tensor, `.cpu()`/`.numpy()`/`.tolist()` read one."""

    def __init__(self, counter: DeviceReads):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS and _on_device(args[0]):
            self.counter.read(func.__name__)
            with self.counter.quiet():
                out = func(*args, **kwargs)
            return _mark(out.clone(), False) if isinstance(out, torch.Tensor) else out
        out = func(*args, **kwargs)
        device = self.counter.device
        if func is torch.Tensor.to and isinstance(args[0], torch.Tensor):
            to_device = kwargs.get("device") is device or any(a is device for a in args[1:])
            if to_device and not _on_device(args[0]):
                return _mark(out.clone())  # a host tensor's copy on the device
        elif kwargs.get("device") is device:
            _mark(out)
        return out


class _Propagate(TorchDispatchMode):
    """Every aten op (autograd's backward and the optimizer's too): a result computed from a
    device tensor is a device tensor; a scalar read or a copy into a host tensor is counted."""

    def __init__(self, counter: DeviceReads):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ins = tree_flatten((args, kwargs))[0]
        if func is torch.ops.aten._local_scalar_dense.default and _on_device(args[0]):
            self.counter.read("item")
        in_place = func._schema.is_mutable
        if func is torch.ops.aten.copy_.default and _on_device(args[1]) and not _on_device(args[0]):
            self.counter.read("copy_")
        out = func(*args, **kwargs)
        if not in_place and any(_on_device(t) for t in ins):
            _mark(out)
        return out


class DeviceReads:
    """Counts host reads of device tensors while active (see the module docstring)."""

    def __init__(self, device: torch.device):
        self.device = device  # the training device: this object, not any "cpu"
        self.count, self.what, self._quiet, self.paused = 0, [], 0, False

    def read(self, what: str) -> None:
        if not self._quiet and not self.paused:
            self.count += 1
            self.what.append(what)

    def quiet(self):
        counter = self

        class _Quiet:
            def __enter__(self):
                counter._quiet += 1

            def __exit__(self, *exc):
                counter._quiet -= 1

        return _Quiet()

    def __enter__(self):
        self._modes = [_Propagate(self), _Moves(self)]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)


def _counted_run(tmp_path, **train):
    """Train the fixture run (2 epochs of STEPS global steps) with the reads counted per
    optimizer step; checkpoints are not counted."""
    t = trainer(tmp_path, config(tmp_path, **train), Saver(tmp_path))
    t.stop = lambda: False  # a poller, as every Ray Train rank has one
    for p in list(t.model.parameters()) + list(t.model.buffers()):
        _mark(p)
    reads = DeviceReads(t.spec.device)
    per_step, step, checkpoint = [], t.step, t.checkpoint

    def counted_step(*a, **kw):
        per_step.append(reads.count)
        return step(*a, **kw)

    def uncounted_checkpoint(*a, **kw):
        reads.paused = True
        try:
            return checkpoint(*a, **kw)
        finally:
            reads.paused = False

    t.step, t.checkpoint = counted_step, uncounted_checkpoint
    with reads:
        assert t.fit(batches_for(), ListLogger()) == "done"
    per_step.append(reads.count)
    return np.diff(per_step), reads.what, t


def test_the_counter_sees_the_reads_a_gpu_waits_for():
    device = torch.device("cpu")
    reads = DeviceReads(device)
    host = torch.ones(3)
    with reads:
        dev = host.to(device, non_blocking=True)
        x = (dev * 2).sum()
        float(host.sum()), host.tolist(), host.to("cpu").numpy()  # host tensors: no wait
        y = torch.zeros(2, device=device)
        assert reads.count == 0
        float(x)
        x.cpu()
        y.tolist()
        host.copy_(dev)
    assert reads.what == ["item", "cpu", "tolist", "copy_"]


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_one_host_device_synchronisation_per_optimizer_step(tmp_path, grad_accum):
    reads, what, t = _counted_run(tmp_path, grad_accum=grad_accum)
    assert len(reads) == 2 * STEPS // grad_accum == t.steps_done // grad_accum
    assert reads.max() <= 1, (reads.tolist(), what)
    assert reads.sum() == len(reads)  # the one is there: the step's figures reach the host
