"""Every global step of a run, one row each, and every held-out evaluation: what the run's picture
is drawn from (no Ray, no torch).

Rank 0 appends a row per global step (its arrays are sums over all ranks, so the row describes the
global step) and writes the table into each checkpoint it saves (`history.parquet`), so a resumed
run continues the same history from its checkpoint (steps trained again after a failure replace
the lost ones) and a run's history can be read from its storage path alone, local or s3://.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.core.evaluation import range_metric

__all__ = [
    "COLUMNS",
    "EVAL_FILE",
    "EvalHistory",
    "HISTORY_FILE",
    "StepHistory",
    "read_evals",
    "read_history",
]

HISTORY_FILE = "history.parquet"
# Columns, in order: global step (1-based: steps done after it), epoch, bucket of the step, raw
# loss (supervised-token mean), debiased loss, learning rate, real and padded tokens, wall seconds,
# and the step loss's sampling variance (`pipeline.core.jumpiness.sampling_variance`; NaN where
# not given, as in runs recorded before it was).
COLUMNS = (
    "step",
    "epoch",
    "bucket",
    "loss",
    "debiased",
    "lr",
    "real",
    "padded",
    "seconds",
    "noise",
)
_OPTIONAL = {"noise": float("nan")}
_TYPES = {"step": pa.int64(), "epoch": pa.int32(), "bucket": pa.int32()}
# Where a run reports its loss by document length range (`RunSpec.ranges`): per step, each
# range's token-loss sum and supervised tokens (lists), the ranges' edges in the file's metadata.
RANGE_COLUMNS = ("range_loss", "range_tokens")
_RANGE_EDGES = b"bucketray.range_edges"


@dataclass
class StepHistory:
    """Rows of COLUMNS, appended step by step; `table()` and `write()` for checkpoints."""

    rows: dict[str, list] = field(default_factory=lambda: {c: [] for c in COLUMNS})
    range_edges: list[int] = field(default_factory=list)  # [] where the run has no ranges
    ranges: dict[str, list] = field(default_factory=lambda: {c: [] for c in RANGE_COLUMNS})

    def __len__(self) -> int:
        return len(self.rows["step"])

    def append(self, **row: float) -> None:
        missing = set(COLUMNS) - set(row) - set(_OPTIONAL)
        if missing:
            raise ValueError(f"history row without {sorted(missing)}")
        for c in COLUMNS:
            self.rows[c].append(row.get(c, _OPTIONAL.get(c)))
        for c in RANGE_COLUMNS:
            self.ranges[c].append([float(v) for v in row.get(c, ())])

    def truncate(self, steps_done: int) -> None:
        """Keep the rows of steps <= steps_done (a checkpoint's position)."""
        keep = sum(1 for s in self.rows["step"] if s <= steps_done)
        for c in COLUMNS:
            del self.rows[c][keep:]
        for c in RANGE_COLUMNS:
            del self.ranges[c][keep:]

    def table(self) -> pa.Table:
        t = {c: pa.array(self.rows[c], _TYPES.get(c, pa.float64())) for c in COLUMNS}
        if not self.range_edges:
            return pa.table(t)
        for c in RANGE_COLUMNS:
            t[c] = pa.array(self.ranges[c], pa.list_(pa.float64()))
        edges = ",".join(str(int(e)) for e in self.range_edges).encode()
        return pa.table(t, metadata={_RANGE_EDGES: edges})

    def arrays(self) -> dict[str, np.ndarray]:
        """Each column as an array; with ranges, `range_loss` and `range_tokens` as [steps,
        ranges] (NaN for a step recorded without them)."""
        out = {c: np.asarray(self.rows[c]) for c in COLUMNS}
        if self.range_edges:
            R = len(self.range_edges) - 1
            for c in RANGE_COLUMNS:
                a = np.full((len(self), R), np.nan)
                for i, v in enumerate(self.ranges[c]):
                    if len(v) == R:
                        a[i] = v
                out[c] = a
        return out

    def write(self, directory: str) -> None:
        pq.write_table(self.table(), f"{directory}/{HISTORY_FILE}")

    @classmethod
    def from_table(cls, table: pa.Table) -> StepHistory:
        h = cls()
        for c in COLUMNS:
            if c in table.column_names:
                h.rows[c] = table.column(c).to_pylist()
            else:  # a column added later: unknown for older rows
                h.rows[c] = [float("nan")] * table.num_rows
        meta = table.schema.metadata or {}
        if _RANGE_EDGES in meta and all(c in table.column_names for c in RANGE_COLUMNS):
            h.range_edges = [int(e) for e in meta[_RANGE_EDGES].decode().split(",")]
            for c in RANGE_COLUMNS:
                h.ranges[c] = [list(v or ()) for v in table.column(c).to_pylist()]
        else:
            h.ranges = {c: [[] for _ in range(table.num_rows)] for c in RANGE_COLUMNS}
        return h

    @classmethod
    def read_dir(cls, directory: str) -> StepHistory:
        """The history in a local checkpoint directory; empty when it has none (older runs)."""
        try:
            return cls.from_table(pq.read_table(f"{directory}/{HISTORY_FILE}"))
        except FileNotFoundError:
            return cls()


def read_history(fs: pafs.FileSystem, checkpoint_path: str) -> StepHistory:
    """The history stored in a checkpoint on any pyarrow filesystem (only that one file is read)."""
    try:
        with fs.open_input_file(f"{checkpoint_path.rstrip('/')}/{HISTORY_FILE}") as f:
            return StepHistory.from_table(pq.read_table(f))
    except FileNotFoundError:
        return StepHistory()


EVAL_FILE = "eval_history.parquet"
# One row per evaluation: the global steps done when it ran (0: before training), the epoch, the
# held-out figures (pipeline.core.evaluation.EvalSums.metrics) and the seconds it took; the loss
# of each training bucket is a list (NaN where the held-out set has no sample of that bucket).
EVAL_COLUMNS = ("step", "epoch", "loss", "accuracy", "loss_per_sample", "tokens", "samples")
# Where the run has length ranges (one bucket: `RunSpec.ranges`, the ranges of its training
# loss), the held-out loss of each range is a list too, the ranges' edges in the metadata.
EVAL_RANGE_COLUMN = "loss_by_length"


@dataclass
class EvalHistory:
    """Every evaluation of a run, written into each checkpoint beside the step history, so a
    resumed run neither repeats nor skips one."""

    rows: list[dict] = field(default_factory=list)
    range_edges: list[int] = field(default_factory=list)  # [] where the run has no ranges

    def __len__(self) -> int:
        return len(self.rows)

    def steps(self) -> list[int]:
        return [int(r["step"]) for r in self.rows]

    def append(
        self, step: int, epoch: int, metrics: dict, num_buckets: int, seconds: float, ranges=()
    ):
        """Record one evaluation's `eval/*` figures; `ranges`: the run's length ranges, whose
        `eval/loss_by_length/<lo>-<hi>` figures are kept (NaN for one not in `metrics`)."""
        nan = float("nan")
        by_bucket = [
            float(metrics.get(f"eval/loss_by_bucket/{k}", nan)) for k in range(num_buckets)
        ]
        row = {"step": int(step), "epoch": int(epoch), "seconds": float(seconds)}
        row.update({c: float(metrics[f"eval/{c}"]) for c in EVAL_COLUMNS[2:]})
        row["loss_by_bucket"] = by_bucket
        if len(ranges) > 1:
            self.range_edges = [int(e) for e in ranges]
            R = len(ranges) - 1
            row[EVAL_RANGE_COLUMN] = [
                float(metrics.get(range_metric(ranges, r), nan)) for r in range(R)
            ]
        self.rows.append(row)

    def truncate(self, steps_done: int) -> None:
        """Keep the evaluations of steps <= steps_done (a checkpoint's position)."""
        self.rows = [r for r in self.rows if r["step"] <= steps_done]

    def _by_length(self) -> list[list[float]]:
        """Each row's held-out loss per length range, NaN for a row recorded without them."""
        R = len(self.range_edges) - 1
        out = []
        for r in self.rows:
            v = r.get(EVAL_RANGE_COLUMN) or []
            out.append([float(x) for x in v] if len(v) == R else [float("nan")] * R)
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """Each column as an array; `loss_by_bucket` [evals, buckets] and, with length ranges,
        `loss_by_length` [evals, ranges]."""
        cols = (*EVAL_COLUMNS, "seconds")
        out = {c: np.asarray([r[c] for r in self.rows], dtype=np.float64) for c in cols}
        k = max((len(r["loss_by_bucket"]) for r in self.rows), default=0)
        by = np.full((len(self.rows), k), np.nan)
        for i, r in enumerate(self.rows):
            by[i, : len(r["loss_by_bucket"])] = r["loss_by_bucket"]
        out["loss_by_bucket"] = by
        if self.range_edges:
            R = len(self.range_edges) - 1
            out[EVAL_RANGE_COLUMN] = np.asarray(self._by_length(), dtype=np.float64).reshape(-1, R)
        return out

    def table(self) -> pa.Table:
        cols = {c: [r[c] for r in self.rows] for c in (*EVAL_COLUMNS, "seconds")}
        t = {c: pa.array(v, _TYPES.get(c, pa.float64())) for c, v in cols.items()}
        t["loss_by_bucket"] = pa.array(
            [r["loss_by_bucket"] for r in self.rows], pa.list_(pa.float64())
        )
        if not self.range_edges:
            return pa.table(t)
        t[EVAL_RANGE_COLUMN] = pa.array(self._by_length(), pa.list_(pa.float64()))
        edges = ",".join(str(int(e)) for e in self.range_edges).encode()
        return pa.table(t, metadata={_RANGE_EDGES: edges})

    def write(self, directory: str) -> None:
        pq.write_table(self.table(), f"{directory}/{EVAL_FILE}")

    @classmethod
    def from_table(cls, table: pa.Table) -> EvalHistory:
        meta = table.schema.metadata or {}
        edges = []
        if _RANGE_EDGES in meta and EVAL_RANGE_COLUMN in table.column_names:
            edges = [int(e) for e in meta[_RANGE_EDGES].decode().split(",")]
        return cls(rows=table.to_pylist(), range_edges=edges)

    @classmethod
    def read_dir(cls, directory: str) -> EvalHistory:
        """The evaluations in a local checkpoint directory; empty when it has none."""
        try:
            return cls.from_table(pq.read_table(f"{directory}/{EVAL_FILE}"))
        except FileNotFoundError:
            return cls()


def read_evals(fs: pafs.FileSystem, checkpoint_path: str) -> EvalHistory:
    """The evaluations stored in a checkpoint on any pyarrow filesystem."""
    try:
        with fs.open_input_file(f"{checkpoint_path.rstrip('/')}/{EVAL_FILE}") as f:
            return EvalHistory.from_table(pq.read_table(f))
    except FileNotFoundError:
        return EvalHistory()
