"""bench.window_cluster's arithmetic on hand-made inputs (no Ray): bytes per node from a fake
location map, rates, the read-once check, the default window and the table; and the per-node
store probe's bookkeeping on fake raylet replies."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from bench.probes import NodeStorePeaks
from bench.window_cluster import (
    INLINE,
    default_window_tokens,
    node_bytes,
    prep_rates,
    rank_rate,
    read_check,
    render,
)

MIB = 2**20

# ranks 0 and 1 on n0, rank 2 on n1; each block: (rank, bytes, the nodes holding it when handed)
RANK_NODE = ["n0", "n0", "n1"]
BLOCKS = [
    (0, 100, ["n0"]),  # on its rank's node
    (0, 50, ["n1"]),  # n1 sends it
    (1, 30, ["n1", "n0"]),  # held on both: its rank's node has it, nothing crosses
    (2, 80, ["n0"]),  # n0 sends it
    (2, 20, ["n1"]),
    (1, 10, []),  # inline, from its owner
]


def test_node_bytes_counts_what_each_node_holds_sends_and_its_ranks_get():
    got = node_bytes(BLOCKS, RANK_NODE, ["head", "n0", "n1"])
    assert got["total_bytes"] == 290
    n = got["nodes"]
    assert n["head"] == {
        "stored": 0,
        "sent": 0,
        "own": 0,
        "own_share": 0.0,
        "sent_per_own": None,
    }
    assert (n["n0"]["stored"], n["n0"]["sent"], n["n0"]["own"]) == (210, 80, 190)
    assert (n["n1"]["stored"], n["n1"]["sent"], n["n1"]["own"]) == (100, 50, 100)
    assert n["n0"]["own_share"] == pytest.approx(190 / 290)
    assert n["n0"]["sent_per_own"] == pytest.approx(80 / 190)
    assert n["n1"]["sent_per_own"] == pytest.approx(0.5)
    assert n[INLINE] == {"stored": 0, "sent": 10, "own": 0, "own_share": 0.0, "sent_per_own": None}
    assert got["max_sent_per_own"] == pytest.approx(0.5)
    assert [r["bytes"] for r in got["ranks"]] == [150, 40, 100]
    assert [r["local_bytes"] for r in got["ranks"]] == [100, 30, 20]
    assert [r["local_share"] for r in got["ranks"]] == pytest.approx([2 / 3, 0.75, 0.2])
    assert got["min_local_share"] == pytest.approx(0.2)


def test_node_bytes_counts_blocks_placed_before_they_were_handed_as_sent():
    """Blocks copied to their rank's node by the feeder are local when handed, but the node
    that held them sent them: that counts against its share."""
    local = [(0, 7, ["a"]), (1, 5, ["b"])]
    got = node_bytes(local, ["a", "b"], ["a", "b"], {"a": 5})
    assert got["nodes"]["a"]["sent"] == 5 and got["nodes"]["b"]["sent"] == 0
    assert got["max_sent_per_own"] == pytest.approx(5 / 7)
    assert [r["local_share"] for r in got["ranks"]] == [1.0, 1.0]


def test_node_bytes_with_every_block_local_sends_nothing():
    got = node_bytes([(0, 7, ["a"]), (1, 5, ["b"])], ["a", "b"], ["a", "b"])
    assert got["max_sent_per_own"] == 0.0 and got["min_local_share"] == 1.0
    assert node_bytes([], ["a"], ["a"])["max_sent_per_own"] is None  # nothing handed out


def test_rank_rate_leaves_the_waiting_steps_out():
    rec = {
        "steps": [0, 1, 2, 3, 4],
        "real": [10, 20, 30, 40, 50],
        "secs": [1.0, 0.5, 0.5, 2.0, 1.0],
        "began": 100.0,
        "end": 110.0,
    }
    got = rank_rate(rec, {0, 3, 99})  # steps 0 and 3 open a range
    assert got["tokens_per_s"] == pytest.approx((20 + 30 + 50) / (0.5 + 0.5 + 1.0))
    assert got["busy_s"] == pytest.approx(2.0)
    assert got["wait_s"] == pytest.approx(3.0)
    assert got["wait_share"] == pytest.approx(0.3)
    assert rank_rate(rec | {"secs": [0.0] * 5}, set())["tokens_per_s"] is None


def test_prep_rates_of_the_first_range_and_of_all():
    hist = [
        {"tokens": 100, "plan_s": 0.5, "sort_s": 1.5, "split_s": 0.0},
        {"tokens": 300, "plan_s": 0.0, "sort_s": 2.5, "split_s": 0.5},
    ]
    got = prep_rates(hist)
    assert got["first_tokens_per_s"] == pytest.approx(50.0)
    assert got["sustained_tokens_per_s"] == pytest.approx(400 / 5.0)
    assert got["ranges"] == 2 and got["prepare_s"] == pytest.approx([2.0, 3.0])
    assert prep_rates([])["first_tokens_per_s"] is None


def test_read_check_compares_each_window_with_its_own_row_groups():
    rgs = [3, 2, 4]
    once = read_check(
        [{"chapter": 0, "row_groups_read": 3}, {"chapter": 1, "row_groups_read": 2}], rgs
    )
    assert once["exactly_once"] and once["read_per_row_group"] == 1.0
    assert not once["whole_epoch"]
    again = read_check(
        [{"chapter": 0, "row_groups_read": 3}, {"chapter": 1, "row_groups_read": 3}], rgs
    )
    assert not again["exactly_once"] and again["read_per_row_group"] == pytest.approx(6 / 5)
    whole = [{"chapter": w, "row_groups_read": r} for w, r in enumerate(rgs)]
    assert read_check(whole, rgs)["whole_epoch"]
    # a lead-in cuts window 0 in two ranges, each reading its row groups: read twice
    lead = [{"chapter": 0, "row_groups_read": 3}, *whole]
    got = read_check(lead, rgs)
    assert got["row_groups_read"] == [6, 2, 4] and got["row_groups_of_window"] == [3, 2, 4]
    assert not got["exactly_once"] and got["read_per_row_group"] == pytest.approx(12 / 9)


def test_default_window_is_a_sixteenth_but_holds_two_of_the_largest_row_groups():
    assert default_window_tokens([1] * 101, windows=4) == 26  # ceil(101 / 4)
    assert default_window_tokens([10, 20, 30, 40], windows=4) == 80  # 2 x 40
    assert default_window_tokens([10] * 160) == 100  # 16 windows by default


def _row(resume: bool) -> dict:
    cold = {
        "stop_step": 1200,
        "wall_s": 61.2,
        "first_range_ready_s": 4.12,
        "first_step_s": [4.2, 4.0, 4.4],
        "prep": prep_rates([{"tokens": 6_000_000, "plan_s": 0.0, "sort_s": 2.0, "split_s": 0.0}]),
        "rates": [
            {"tokens_per_s": 1e7, "wait_share": 0.5},
            {"tokens_per_s": 3e7, "wait_share": 0.1},
        ],
        "store": {
            "head": {"peak": 5 * MIB, "peak_primary": MIB, "spilled": 0},
            "n0": {"peak": 200 * MIB, "peak_primary": 50 * MIB, "spilled": 0},
            "n1": {"peak": 100 * MIB, "peak_primary": 30 * MIB, "spilled": 3 * MIB},
        },
        "bytes": node_bytes(BLOCKS, RANK_NODE, ["head", "n0", "n1"]),
        "feeder_peak_held_bytes": 150 * MIB,
        "ranges": [{"bytes_placed": 3 * MIB}] if resume else [{}],
    }
    return {
        "samples": 50_000,
        "tokens": 59_000_000,
        "nodes": 2,
        "ranks_per_node": 2,
        "window_tokens": 20_000_000,
        "windows": 3,
        "window_bytes": 100 * MIB,
        "index_build_s": 7.84,
        "edges_s": 0.38,
        "plan_s": 0.02,
        "cold": cold,
        "resume": {"first_step_s": [8.0, 9.0]} if resume else None,
        "reads": read_check([{"chapter": 0, "row_groups_read": 3}], [3, 2, 4]),
        "resume_reads": {"row_groups_read": 21, "of_window": 11} if resume else None,
        "wall_s": 51.0,
        "load_before": [5.2, 4.0, 3.0],
        "load_after": [8.7, 5.0, 3.0],
        "date_utc": "2026-12-06 00:36 UTC",
    }


def test_render_one_column_per_size_with_what_was_measured():
    machine = {"cpu": "X", "cores": 2, "ram_gib": 23.6, "ray": "2.60.0", "git_commit": "abc"}
    small = _row(True) | {"samples": 30_000}
    lines = render([_row(False), small], machine).splitlines()
    assert lines[0] == "| | 30,000 | 50,000 |" and lines[1] == "|---|---|---|"
    cells = [[c.strip() for c in ln[1:-1].split("|")] for ln in lines[2:] if ln.startswith("| ")]
    table = {c[0]: c[1:] for c in cells}
    assert table["first step, cold: median (min-max) over ranks"][0] == "4.20 (4.00-4.40) s"
    assert table["first step, resume: median (min-max)"] == ["8.50 (8.00-9.00) s", "not measured"]
    assert (
        table["preparation rate, first range (the first window, without lead-in)"][0]
        == "3.0M tok/s"
    )
    assert table["consumer rate per rank: median (min-max)"][0] == "20.0 (10.0-30.0)M tok/s"
    assert table["rank time waiting: median (min-max)"][0] == "30 (10-50) %"
    assert table["store peak per worker node: median (min-max)"][0] == "150 (100-200) MiB"
    ratio = "store peak per node / window bytes (max): in use, primary"
    assert table[ratio][0] == "2.00, 0.50"
    assert table["spilled, all nodes"][0] == "3 MiB"
    assert table["sent / own ranks' bytes, worst node (head: sent)"][0] == "0.50 (0 MiB)"
    assert table["rank's bytes on its node when handed: median (min-max)"][0] == "67 (20-75) %"
    assert table["blocks copied to their rank's node after the pass"] == ["3 MiB", "0 MiB"]
    reads = "row groups read / window's, windows prepared"
    assert table[reads][0] == "1.00 (1 windows, exactly once: yes)"
    assert table["resume's first range: row groups read / window's"][0] == "21 / 11"
    assert table["wall time; load avg before -> after"][0] == "51 s; 5.2 -> 8.7"
    assert lines[-1] == "Machine: X, 2 cores, 23.6 GiB RAM; Ray 2.60.0; commit abc"


def test_node_store_peaks_keeps_each_nodes_peak_above_what_it_started_with():
    replies = {
        "a": iter([(10, 5, 0), (70, 40, 0), (30, 20, 8)]),  # (in use, primary, spilled total)
        "b": iter([(0, 0, 2), (5, 5, 2)]),
    }
    probe = NodeStorePeaks.__new__(NodeStorePeaks)  # no Ray: the raylets' replies are faked
    probe.raylets, probe.nodes, probe._stop = {"a": None, "b": None}, {}, threading.Event()

    def stats(node):
        try:
            used, primary, spilled = next(replies[node])
        except StopIteration:
            raise ConnectionError("raylet gone") from None
        return SimpleNamespace(
            object_store_bytes_used=used,
            object_store_bytes_primary_copy=primary,
            spilled_bytes_total=spilled,
            object_store_bytes_avail=100,
        )

    probe._stats = stats
    for _ in range(3):
        probe._poll()
    assert probe.nodes["a"] == {
        "base": 10,
        "base_spilled": 0,
        "peak": 70,
        "peak_primary": 40,
        "spilled": 8,
        "capacity": 100,
    }
    assert probe.nodes["b"]["peak"] == 5 and probe.nodes["b"]["spilled"] == 0  # kept when gone
