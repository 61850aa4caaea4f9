"""jobs.sizing: the sizing row of a first-step measurement, and the table docs/cluster.md
quotes (no Ray: the measurement is tested in tests/ray with the first-step benchmark)."""

from __future__ import annotations

from jobs.sizing import main, render, summarize


def _run(first_s, filled, rss=2**30, store=2**29):
    return {
        "first_step_s": first_s,
        "range_reads": [
            {"prepare_s": 0.5, "rg_filled": 0},
            {"prepare_s": 3.0, "rg_filled": filled},
        ],
        "feeder_peak_rss_bytes": rss,
        "feeder_peak_private_bytes": rss // 2,
        "peak_object_store_bytes": store,
        "spilled_bytes": 0,
        "prepare_tokens_per_s": 1e7,
        "consumer_tokens_per_s": 1e8,
    }


def _measurement(n: int, warm=True) -> dict:
    return {
        "num_samples": n,
        "num_tokens": 1000 * n,
        "chapters": 4,
        "index_build_s": 8.0,
        "edges_s": 0.1,
        "plan_s": 0.2,
        "row_cache_bytes": 4000 * n,
        "cold": _run(5.0, filled=12),
        "warm": _run(1.0, filled=0, rss=3 * 2**30) if warm else None,
    }


def test_sizing_row_takes_fill_time_from_the_ranges_that_filled_and_peaks_from_both_runs():
    row = summarize(_measurement(1000))
    assert row["row_cache_fill_s"] == 3.0  # only the range that decoded into the cache
    assert row["row_cache_bytes_per_token"] == 4.0
    assert (row["first_step_cold_s"], row["first_step_warm_s"]) == (5.0, 1.0)
    assert row["feeder_peak_rss_bytes"] == 3 * 2**30


def test_sizing_table_has_a_column_per_size_and_says_what_was_not_measured():
    rows = [summarize(_measurement(2000)), summarize(_measurement(1000, warm=False))]
    table = render(rows).splitlines()
    assert table[0] == "| | 1,000 | 2,000 |"
    warm = next(ln for ln in table if ln.startswith("| first step, warm"))
    assert warm == "| first step, warm (filled row cache) | not measured | 1.00 s |"
    assert any("4.00 B/token" in ln for ln in table)


def test_sizing_refuses_a_toy_size(capsys):
    assert main(["--samples", "10"]) == 2
    assert "--samples must be >= 1000" in capsys.readouterr().err
