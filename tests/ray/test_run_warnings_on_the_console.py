"""Warnings raised off the driver reach its console once, with a count when they repeat: a
row-cache file the feeder finds corrupt (detected, dropped and read again from parquet), and
warnings logged by other processes of the run (an index task, a training worker, transformers'
notes), each shown by the driver once as it arrives and counted at the end."""

from __future__ import annotations

import logging
import os
import uuid

import numpy as np
import pyarrow as pa
import pytest
import ray
import torch

from pipeline.data import build_length_index, rank_batches, resolve_edges, start_feeder, stop_feeder
from pipeline.data.run_warnings import (
    ConsoleRelay,
    collector_name,
    forward_warnings,
    start_collector,
    warning_counts,
)
from pipeline.train.launch import run
from tests.helpers import tiny_config
from tests.ray.small_corpus import base_cfg, write_corpus

pytestmark = pytest.mark.ray


def _stream(cfg, index, edges, path) -> list:
    name = f"warn-{uuid.uuid4().hex[:8]}"
    start_feeder(cfg, index, edges, name=name, path=path, prefetch=False)
    try:
        return [
            list(rank_batches(name, epoch=0, start_step=0, rank=r, world_size=2)) for r in (0, 1)
        ]
    finally:
        stop_feeder(name)


def _corrupt(path: str) -> None:
    """One token value changed, the file still readable and its recorded digest kept: what a
    disk that flips bytes leaves behind."""
    with pa.memory_map(path) as src:
        table = pa.ipc.open_file(src).read_all()
    ids = table["input_ids"].combine_chunks()
    values = ids.values.to_numpy().copy()
    values[0] = (values[0] + 1) % 100
    bad = pa.ListArray.from_arrays(ids.offsets, pa.array(values, ids.values.type))
    table = table.set_column(table.schema.get_field_index("input_ids"), "input_ids", bad)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)


@ray.remote
def _a_process_of_the_run(collector: str, source: str, times: int) -> None:
    """Stands for an index task or a training worker: it forwards, then warns."""
    forward_warnings(collector, source)
    for _ in range(times):
        logging.getLogger("pipeline.data.index").warning("data: 3 transient errors retried")
    logging.getLogger("transformers.modeling_utils").warning("\x1b[1mA note\x1b[0m on the\nmodel")


def test_warnings_off_the_driver_reach_its_console_once_with_a_count(cluster, tmp_path, capsys):
    path = str(tmp_path / "data")
    write_corpus(path, np.random.default_rng(3).integers(1, 65, 300), shards=2, rows_per_group=50)
    cfg = base_cfg(path, delivery={"row_cache_dir": str(tmp_path / "rows"), "lead_tokens": None})
    index = build_length_index(cfg)
    edges = resolve_edges(cfg, index.lengths)
    reference = _stream(cfg, index, edges, path)  # fills the row cache
    files = sorted(f for f in os.listdir(tmp_path / "rows") if f.endswith(".arrow"))
    _corrupt(str(tmp_path / "rows" / files[0]))
    name = collector_name(f"test-{uuid.uuid4().hex[:8]}")
    collector = start_collector(name)
    capsys.readouterr()
    try:
        with ConsoleRelay(name, every_s=0.2):
            again = _stream(cfg, index, edges, path)  # a feeder of this run finds the file
            ray.get(
                [
                    _a_process_of_the_run.remote(name, "index", 2),
                    _a_process_of_the_run.remote(name, "rank 1", 1),
                ]
            )
        counts = {w["text"]: w["count"] for w in warning_counts(name)}
    finally:
        ray.kill(collector)
    assert [[mb.sample_ids.tolist() for mb in r] for r in again] == [
        [mb.sample_ids.tolist() for mb in r] for r in reference
    ]  # the right data, read again from parquet
    out = capsys.readouterr().out
    shown = [ln for ln in out.splitlines() if ln.startswith("[bucketray] warning")]
    corrupt = [
        ln for ln in shown if f"row cache file {tmp_path / 'rows' / files[0]} is corrupt" in ln
    ]
    assert len(corrupt) == 1 and corrupt[0].startswith("[bucketray] warning (feeder): data: row")
    assert sum("3 transient errors retried" in ln for ln in shown) == 2  # first seen, repeated
    assert "[bucketray] warning repeated 3 times: data: 3 transient errors retried" in shown
    assert sum("A note on the model" in ln for ln in shown) == 2  # one line, colours dropped
    assert counts["data: 3 transient errors retried"] == 3
    assert counts["A note on the model"] == 2


def warning_model(config: dict) -> torch.nn.Module:
    """A `package.module:factory` model that warns as it is built, on every rank."""
    logging.getLogger("pipeline.tests").warning("the tiny model warns as it is built")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(config["vocab_size"], 8)
            self.head = torch.nn.Linear(8, config["vocab_size"])

        def forward(self, input_ids, attention_mask, position_ids):
            return self.head(self.embed(input_ids))

    return Model()


def test_a_warning_of_every_training_worker_shows_once_with_its_count(cluster, tmp_path, capsys):
    cfg = tiny_config(
        tmp_path,
        model={"name": "tests.ray.test_run_warnings_on_the_console:warning_model"},
        train={"epochs": 1, "max_steps": 3},
    )
    summary = run(cfg)
    assert summary.steps == 3
    shown = [ln for ln in capsys.readouterr().out.splitlines() if "tiny model warns" in ln]
    assert len(shown) == 2, shown
    assert shown[0].startswith("[bucketray] warning (rank ") and shown[0].endswith(
        "the tiny model warns as it is built"
    )
    assert shown[1] == "[bucketray] warning repeated 2 times: the tiny model warns as it is built"
