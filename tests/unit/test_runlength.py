"""run_length: the one rule for steps per epoch, total global steps and total optimizer steps."""

from __future__ import annotations

import pytest

from pipeline.core.config import TrainConfig
from pipeline.core.runlength import RunLength, run_length


@pytest.mark.parametrize(
    "spe, epochs, max_steps, accum, expect",
    [
        (10, 2, None, 1, RunLength(10, 20, 20)),
        (10, 2, None, 3, RunLength(10, 20, 4 + 4)),  # a group never spans an epoch boundary
        (10, 3, 25, 4, RunLength(10, 25, 3 + 3 + 2)),  # cut at max_steps global steps
        (10, 1, 5, 1, RunLength(10, 5, 5)),
        (10, 2, 1000, 1, RunLength(10, 20, 20)),  # max_steps beyond the epochs: all epochs
    ],
)
def test_run_length(spe, epochs, max_steps, accum, expect):
    got = run_length(spe, TrainConfig(epochs=epochs, max_steps=max_steps, grad_accum=accum))
    assert got == expect


def test_epochs_touched_counts_a_cut_last_epoch():
    assert run_length(10, TrainConfig(epochs=3, max_steps=25)).epochs == 3
    assert run_length(10, TrainConfig(epochs=3, max_steps=20)).epochs == 2
    assert run_length(10, TrainConfig(epochs=3)).epochs == 3


def test_no_steps_is_refused():
    with pytest.raises(ValueError, match="steps_per_epoch must be >= 1"):
        run_length(0, TrainConfig())
