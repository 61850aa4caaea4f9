"""The delivery section: how rows reach the ranks, apart from which data. A key that moved there
from `data:` is refused in one line naming its new place, from a file or from `--set`; a
config a checkpoint recorded before the move is read with the keys in their new place."""

from __future__ import annotations

import json

import pytest

from pipeline.core.config import ConfigError, DataConfig, DeliveryConfig, load_config
from pipeline.core.deliveryconfig import MOVED_FROM_DATA, upgrade_recorded
from tests.helpers import tiny_raw


@pytest.mark.parametrize("key", MOVED_FROM_DATA)
def test_a_moved_data_key_is_refused_from_set_naming_its_new_place(key):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.synthetic={}", f"data.{key}=null"])
    msg = str(e.value)
    assert f"data.{key} moved to delivery.{key}" in msg and "\n" not in msg


def test_a_moved_data_key_is_refused_from_a_file_naming_every_one(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("data:\n  synthetic: {}\n  chapter_tokens: 1024\n  row_cache: false\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == (
        "invalid config: data.chapter_tokens moved to delivery.chapter_tokens; data.row_cache "
        "moved to delivery.row_cache: write them in the delivery section"
    )


def test_data_says_which_data_and_delivery_how_it_is_served():
    assert not set(MOVED_FROM_DATA) & set(DataConfig.model_fields)
    assert set(MOVED_FROM_DATA) == set(DeliveryConfig.model_fields)
    cfg = load_config(None, ["data.synthetic={}", "delivery.chapter_steps=7"])
    assert cfg.delivery.chapter_steps == 7 and cfg.delivery_used.row_cache


def test_a_config_recorded_before_the_delivery_section_keeps_its_values(tmp_path):
    from pipeline.learn.checkpoint import RUN_CONFIG_FILE, DataPosition
    from pipeline.train.evaluate_run import EvalTarget, target_config

    old = tiny_raw(tmp_path, eval={"split": "validation"})
    old["data"]["synthetic"]["heldout"] = 0.1
    old["data"] |= {"chapter_steps": 5, "lead_tokens": None, "row_cache": False}
    upgraded = upgrade_recorded(old)
    assert "chapter_steps" not in upgraded["data"] and "chapter_steps" in old["data"]
    (tmp_path / RUN_CONFIG_FILE).write_text(json.dumps(old))
    position = DataPosition.__new__(DataPosition)  # target_config reads the config only
    cfg = target_config(EvalTarget(str(tmp_path), position), ["delivery.chapter_steps=6"])
    assert (cfg.delivery.chapter_steps, cfg.delivery.lead_tokens) == (6, None)
    assert cfg.delivery.row_cache is False


def test_windows_read_by_their_passes_by_default_no_row_cache_no_lead_in():
    """With windows each row group is read once per epoch by its window's Ray Data pass and the
    feeder reads no rows: the row cache and the lead-in, on for a global plan, are off by default
    (a value set explicitly is kept)."""
    from pipeline.core.deliveryconfig import DEFAULT_LEAD_TOKENS
    from pipeline.data.rowcache import RowCache

    glob = load_config(None, ["data.synthetic={}"])
    win = load_config(None, ["data.synthetic={}", "plan.window_tokens=100000"])
    assert (glob.delivery.row_cache, glob.delivery.lead_tokens) == (None, "auto")
    assert (glob.delivery_used.row_cache, glob.delivery_used.lead_tokens) == (
        True,
        DEFAULT_LEAD_TOKENS,
    )
    assert (win.delivery_used.row_cache, win.delivery_used.lead_tokens) == (False, None)
    assert RowCache.for_run(win, index=None) is None  # decided before the index is looked at
    asked = load_config(
        None,
        [
            "data.synthetic={}",
            "plan.window_tokens=100000",
            "delivery.row_cache=true",
            "delivery.lead_tokens=1024",
        ],
    )
    assert (asked.delivery_used.row_cache, asked.delivery_used.lead_tokens) == (True, 1024)
    off = load_config(None, ["data.synthetic={}", "delivery.lead_tokens=null"])
    assert off.delivery_used.lead_tokens is None
    # a recorded config (every field written out) decides the same again
    again = type(win).model_validate(win.model_dump())
    assert again.delivery_used == win.delivery_used


def test_a_row_cache_dir_beside_windows_is_refused_unless_the_cache_is_asked_for():
    base = ["data.synthetic={}", "plan.window_tokens=100000", "delivery.row_cache_dir=/tmp/rows"]
    with pytest.raises(ConfigError) as e:
        load_config(None, base)
    assert "delivery.row_cache_dir has no effect with plan.window_tokens" in str(e.value)
    assert "set delivery.row_cache=true" in str(e.value)
    assert load_config(None, [*base, "delivery.row_cache=true"]).delivery_used.row_cache
