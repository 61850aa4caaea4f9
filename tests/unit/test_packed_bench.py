"""The "Packed rows" benchmark (`bench.packed`): the step kernel times the variants it names on the
same documents, and the packed tables of BENCHMARKS.md show what it and the paper table measured."""

from __future__ import annotations

from bench import table_blocks as tb
from bench.packed import ROW_LENGTHS, measure_step_kernel
from bench.packing import packing_table
from pipeline.core.synthetic import seed902k_lengths


def test_the_step_kernel_times_padded_and_packed_batches_of_the_same_documents():
    k = measure_step_kernel(tokens=600, repeats=1)
    assert set(k["seconds"]) == {"padded", "packed", "packed_block_mask"}
    assert all(len(ts) == 2 for ts in k["seconds_all"].values())  # a warm-up, then the repeat
    assert k["row_tokens"] == ROW_LENGTHS * k["max_length"]
    # The same documents both ways: about 600 real tokens fill one packed row; padded batches pay
    # each batch's padding to its longest sample.
    assert k["real_tokens"] <= 600 and k["packed_rows"] == 1
    assert k["packed_slots"] == k["row_tokens"] and k["real_tokens"] <= k["padded_slots"]
    assert k["packed_vs_padded"] == k["seconds"]["padded"] / k["seconds"]["packed"]


def test_the_packed_tables_show_the_measured_figures():
    kernel = measure_step_kernel(tokens=600, repeats=1)
    paper = packing_table(seed902k_lengths(3000), pairs=20_000, balance_rows=64)
    r = {"packed": {"paper": paper, "kernel": kernel}}
    text = tb.packed_kernel(r) + "\n" + tb.packed_paper(r)
    assert f"| {kernel['seconds']['packed']:.3f} |" in text
    assert f"({kernel['documents']} documents, {kernel['real_tokens']:,} real tokens)" in text
    assert f"| 3,000 | {paper['attention_width']:,} |" in text and "token efficiency (8)" in text
    assert f"| {paper['pack_epoch_s']:.2f} |" in text
    assert "nan" not in text and "None" not in text
