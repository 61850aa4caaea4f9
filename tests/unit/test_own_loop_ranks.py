"""The own-loop API refuses a rank that is not one of the world's before the feeder is asked:
one ConfigError line naming both numbers, not an IndexError deep in the feeder."""

from __future__ import annotations

import pytest

from pipeline.core.config import ConfigError
from pipeline.data import api


@pytest.mark.parametrize("rank, world", [(2, 2), (5, 2), (-1, 2), (0, 0)])
def test_a_rank_outside_the_world_is_refused_before_the_feeder_is_asked(monkeypatch, rank, world):
    asked = []
    monkeypatch.setattr(api, "rank_batches", lambda feeder, **kw: asked.append(kw) or iter(()))
    d = api.Delivery("f", "p", [0, 8], 4, 10, [4, 4], 8, ["h0", "h1"], 2)
    with pytest.raises(ConfigError, match=rf"^rank={rank} is not a rank of world_size={world}"):
        next(api.iter_micro_batches(d, epoch=0, rank=rank, world_size=world))
    with pytest.raises(ConfigError, match="is not a rank of"):
        next(api.iter_run(d, rank=rank, world_size=world))
    assert asked == []
    list(api.iter_micro_batches(d, epoch=0, rank=1, world_size=2))  # the last rank is fine
