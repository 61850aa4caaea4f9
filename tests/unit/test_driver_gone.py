"""Workers stop when their driver is gone: the stop flag's poller raises DriverGoneError, asked
afresh before each checkpoint, and the Trainer ends on every rank without writing a checkpoint
that nobody would register."""

from __future__ import annotations

import pytest

from pipeline.learn.logger import ListLogger
from pipeline.train.stop import DriverGoneError
from tests.unit.trainer_fixtures import Saver, batches_for, config, trainer


class DyingDriver:
    """A poller whose driver dies after global step `dies_after`: its at-its-own-pace poll has
    not noticed yet, the fresh one asked before a checkpoint has."""

    def __init__(self):
        self.dead = False
        self.asked = []

    def __call__(self) -> bool:
        self.asked.append("poll")
        return False

    def fresh(self) -> bool:
        self.asked.append("fresh")
        if self.dead:
            raise DriverGoneError("the run's driver is gone (its stop flag died)")
        return False


def test_a_driver_gone_ends_the_run_without_another_checkpoint(tmp_path):
    saver, poller = Saver(tmp_path), DyingDriver()
    t = trainer(tmp_path, config(tmp_path), saver, stop=poller)
    step = t.step

    def dying(group, *args, **kw):  # at the step: the stream runs ahead of it
        if group[0].step == 4:  # the driver is SIGKILLed while step 4 trains
            poller.dead = True
        return step(group, *args, **kw)

    t.step = dying
    with pytest.raises(DriverGoneError, match="driver is gone"):
        t.fit(batches_for(), ListLogger())
    # step 3's checkpoint (the driver alive), none at step 6 where the next one was due
    assert [name for name, _ in saver.reports] == ["checkpoint_step00000003"]
    assert t.steps_done == 6
    assert poller.asked.count("fresh") == 2  # asked afresh before each due checkpoint only
    assert getattr(DriverGoneError("x"), "retryable", True) is False  # never retried
