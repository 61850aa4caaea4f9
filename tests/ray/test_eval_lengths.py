"""Held-out samples longer than every training sample, in a real run (padded and packed) and in
`jobs.evaluate --set eval.path=...`: cut at the top edge training uses, counted there, and
evaluated on every worker (each worker raised "lengths fall outside edges" before); a packed
run of one bucket's held-out loss by length range is the same in the run and in
`jobs.evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs import evaluate as evaluate_job
from pipeline.core.config import validate
from pipeline.core.evaluation import range_metric
from pipeline.train.history import EvalHistory, StepHistory
from pipeline.train.launch import run
from tests.helpers import tiny_raw, write_held_out

pytestmark = pytest.mark.ray

TRAIN_TOP = 40  # the longest training sample: the optimised top edge; data.max_length is 64


def _training_data(directory: Path) -> str:
    """600 training samples of 2 to 40 tokens, drawn like the tiny corpus, ids 0..599."""
    import numpy as np
    import pyarrow.parquet as pq

    from pipeline.core.synthetic import synthetic_tokens
    from pipeline.data.corpus import token_table

    lengths = np.random.default_rng(0).integers(2, TRAIN_TOP + 1, 600)
    lengths[0] = TRAIN_TOP
    ids = np.arange(600)
    values, offsets = synthetic_tokens(lengths, ids, vocab_size=64, seed=0)
    directory.mkdir(parents=True)
    pq.write_table(token_table(ids, values, offsets), directory / "train-00000.parquet")
    return str(directory)


@pytest.mark.parametrize(
    "packed, one_bucket",
    [
        # the default suite runs the one-bucket packed case (with one jobs.evaluate); the rest,
        # a minute each, are slow
        pytest.param(False, False, marks=pytest.mark.slow),
        pytest.param(True, False, marks=pytest.mark.slow),
        (True, True),
    ],
    ids=["padded", "packed-2-buckets", "packed-1-bucket"],
)
def test_held_out_samples_longer_than_every_training_sample(
    cluster, tmp_path, packed, one_bucket, capsys
):
    held = write_held_out(tmp_path / "held", n=30, max_length=64)
    short = write_held_out(tmp_path / "short", n=12, max_length=24, seed=3)
    batching = {"mode": "packed", "row_tokens": 64, "rows_per_step": 4} if packed else None
    raw = tiny_raw(
        tmp_path,
        data={"path": _training_data(tmp_path / "train")},
        train={"epochs": 1, "max_steps": 6},
        checkpoint={"run_name": f"long-{packed}"},
        eval={"path": held, "at_start": True},
        **({"batching": batching} if batching else {}),
        **({"buckets": {"num_buckets": "auto"}} if one_bucket else {}),  # packed: one bucket
    )
    summary = run(validate(raw))
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if "held-out set" in x)
    assert f"truncated at the top edge {TRAIN_TOP}" in line, line
    assert summary.steps == 6
    # jobs.evaluate on another held-out set (in the slow cases: a Ray Train run of its own each),
    # and back on the long one: the run's own top edge.
    run_dir = str(Path(tmp_path) / "runs" / f"long-{packed}")
    out = tmp_path / "eval.json"
    for path, n in ((short, 12), (held, 30))[int(one_bucket) :]:
        args = [run_dir, "--set", f"eval.path={path}", "--json", str(out)]
        # short samples of the learnable corpus may repeat a training one: left out, counted
        assert evaluate_job.main([*args, "--set", "eval.on_overlap=drop"]) == 0
        assert n - 2 <= json.loads(out.read_text())["eval/samples"] <= n
    # One bucket: the held-out loss by the training loss's length ranges, in the run's
    # evaluations and in jobs.evaluate's figures of its last checkpoint (the same); none with
    # buckets, whose buckets are the run's length ranges.
    ranges = StepHistory.read_dir(summary.checkpoint).range_edges
    evals = EvalHistory.read_dir(summary.checkpoint)
    assert evals.range_edges == ranges
    got = json.loads(out.read_text())
    names = [range_metric(ranges, r) for r in range(len(ranges) - 1)]
    assert sorted(k for k in got if k.startswith("eval/loss_by_length/")) == sorted(names)
    assert (len(ranges) > 2) == one_bucket
    if one_bucket:
        last = evals.arrays()["loss_by_length"][-1]
        assert [got[k] for k in names] == pytest.approx(last.tolist(), rel=1e-5, nan_ok=True)
