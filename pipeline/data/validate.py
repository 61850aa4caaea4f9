"""Contract 10 on the driver: the config-dependent rules (vocabulary, top edge, sample ids,
duplicates) applied to the scan table in milliseconds; bad rows stop the run naming file, row
group, sample id and reason, or go to a quarantine parquet and are counted."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.data.errors import DataError
from pipeline.data.fs import filesystem_for
from pipeline.data.scan import Flag
from pipeline.data.source import DataOptions

__all__ = ["Reason", "Validated", "check_duplicate_content", "validate"]

log = logging.getLogger("bucketray.data")


class Reason(IntEnum):
    """Why a row is bad; when several apply, the smallest value is reported."""

    NULL_ROW = 1
    NULL_TOKEN = 2
    EMPTY = 3
    OVER_LENGTH = 4
    NEGATIVE_TOKEN = 5
    TOKEN_OVER_INT64 = 6
    TOKEN_OVER_VOCAB = 7
    MASK_LENGTH = 8
    LABELS_LENGTH = 9
    LABEL_RANGE = 10
    NULL_SAMPLE_ID = 11
    SAMPLE_ID_OVER_INT64 = 12
    NEGATIVE_SAMPLE_ID = 13
    DUPLICATE_SAMPLE_ID = 14

    def text(self, **kw) -> str:
        return _MESSAGES[self].format(**kw)


_MESSAGES = {
    Reason.NULL_ROW: "input_ids is null",
    Reason.NULL_TOKEN: "null token id in input_ids",
    Reason.EMPTY: "empty input_ids",
    Reason.OVER_LENGTH: "length {length} exceeds the top bucket edge {top} (raise the top edge "
    "or set data.over_length=truncate)",
    Reason.NEGATIVE_TOKEN: "token id {min_id} < 0",
    Reason.TOKEN_OVER_INT64: "token id >= 2**63 (unsigned) >= model.vocab_size {vocab}",
    Reason.TOKEN_OVER_VOCAB: "token id {max_id} >= model.vocab_size {vocab}",
    Reason.MASK_LENGTH: "loss_mask length != input_ids length",
    Reason.LABELS_LENGTH: "labels length != input_ids length",
    Reason.LABEL_RANGE: "label outside [0, model.vocab_size {vocab}) and not -100",
    Reason.NULL_SAMPLE_ID: "sample_id is null",
    Reason.SAMPLE_ID_OVER_INT64: "sample_id >= 2**63 (unsigned); sample ids must fit int64",
    Reason.NEGATIVE_SAMPLE_ID: "sample_id {sid} < 0; sample ids must be non-negative",
    Reason.DUPLICATE_SAMPLE_ID: "duplicate sample_id (first seen in {first_file} row {first_row})",
}
# Reasons whose sample id is not a usable number (quarantined with a null sample_id).
_NO_SID = (Reason.NULL_SAMPLE_ID, Reason.SAMPLE_ID_OVER_INT64)


@dataclass(frozen=True)
class Validated:
    """Every scanned row (flattened, file after file) and the verdict on it."""

    keep: np.ndarray  # bool: the row is trained
    sample_ids: np.ndarray  # int64
    lengths: np.ndarray  # int32, unclipped
    file_idx: np.ndarray  # int32
    rows: np.ndarray  # int64, row inside its file
    num_records: int  # quarantine records: bad rows plus unusable files
    quarantine_path: str | None
    row_hash: np.ndarray | None = None  # int64: a hash of each row's tokens (scan.row_hashes)


def _flat(table: pa.Table, name: str) -> np.ndarray:
    return pc.list_flatten(table[name]).to_numpy()


def _row_groups_of(rg_rows: list[list[int]], fidx: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The row group holding each (file, row), vectorized over a global row-group table."""
    sizes = np.array([n for r in rg_rows for n in r], dtype=np.int64)
    file_of = np.repeat(np.arange(len(rg_rows)), [len(r) for r in rg_rows])
    first = np.cumsum(sizes) - sizes  # global first row of each row group
    base = np.concatenate([[0], np.cumsum([sum(r) for r in rg_rows])])[:-1].astype(np.int64)
    first_group = np.concatenate([[0], np.cumsum([len(r) for r in rg_rows])])[:-1]
    glob = np.searchsorted(first, base[fidx] + rows, side="right") - 1
    return glob - first_group[file_of[glob]] if glob.size else glob


def _reasons(table: pa.Table, opts: DataOptions) -> dict:
    """Per-row arrays and the first reason each row is bad for (0: good)."""
    counts = pc.list_value_length(table["length"]).to_numpy()
    n = int(counts.sum())
    fidx = np.repeat(np.arange(table.num_rows, dtype=np.int32), counts)
    rows = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    sid = _flat(table, "sample_id").astype(np.int64)
    length = _flat(table, "length").astype(np.int32)
    mins, maxs, flags = _flat(table, "min_id"), _flat(table, "max_id"), _flat(table, "flags")
    lab_rows = np.repeat(pc.list_value_length(table["lab_min"]).to_numpy() > 0, counts)
    lab_min = np.zeros(n, dtype=np.int64)
    lab_max = np.zeros(n, dtype=np.int64)
    lab_min[lab_rows] = _flat(table, "lab_min")
    lab_max[lab_rows] = _flat(table, "lab_max")
    vocab = opts.vocab_size
    checks = {
        Reason.NULL_ROW: (flags & Flag.NULL_ROW) > 0,
        Reason.NULL_TOKEN: (flags & Flag.NULL_TOKEN) > 0,
        Reason.EMPTY: length == 0,
        Reason.OVER_LENGTH: (length > opts.top) & (not opts.truncate),
        Reason.NEGATIVE_TOKEN: mins < 0,
        Reason.TOKEN_OVER_INT64: (flags & Flag.ID_OVER_INT64) > 0,
        Reason.TOKEN_OVER_VOCAB: maxs >= vocab,
        Reason.MASK_LENGTH: (flags & Flag.MASK_LEN) > 0,
        Reason.LABELS_LENGTH: (flags & Flag.LABELS_LEN) > 0,
        Reason.LABEL_RANGE: lab_rows & ((lab_min < 0) | (lab_max >= vocab)),
        Reason.NULL_SAMPLE_ID: (flags & Flag.NULL_SID) > 0,
        Reason.SAMPLE_ID_OVER_INT64: (flags & Flag.SID_OVER_INT64) > 0,
        Reason.NEGATIVE_SAMPLE_ID: sid < 0,
    }
    reason = np.zeros(n, dtype=np.int8)
    for code in sorted(checks, reverse=True):  # the smallest code is assigned last and wins
        reason[checks[code]] = code
    first_of = _mark_duplicates(sid, reason)
    return dict(fidx=fidx, rows=rows, sid=sid, length=length, mins=mins, maxs=maxs,
                reason=reason, first_of=first_of,
                row_hash=_flat(table, "row_hash").astype(np.int64))  # fmt: skip


def _mark_duplicates(sid: np.ndarray, reason: np.ndarray) -> np.ndarray:
    """Among good rows, every repeat of a sample id gets DUPLICATE_SAMPLE_ID; returns, per row,
    the position of the first occurrence (the one kept, first in file order)."""
    good = np.flatnonzero(reason == 0)
    order = good[np.argsort(sid[good], kind="stable")]
    first_of = np.zeros(sid.size, dtype=np.int64)
    if order.size > 1:
        same = sid[order[1:]] == sid[order[:-1]]
        if same.any():
            run_start = np.maximum.accumulate(
                np.where(np.concatenate([[True], ~same]), np.arange(order.size), 0)
            )
            later = np.flatnonzero(np.concatenate([[False], same]))
            reason[order[later]] = Reason.DUPLICATE_SAMPLE_ID
            first_of[order[later]] = order[run_start[later]]
    return first_of


def check_duplicate_content(table: pa.Table, files: list[str]) -> None:
    """Refuse row groups with identical input_ids (a copied shard) unless both files carry a
    sample_id column (then the duplicate-sample-id rule names the rows). One step per row group."""
    has_sid = table["has_sample_id"].to_pylist()
    seen: dict[str, list[tuple[int, int]]] = {}
    for f, (digests, sizes) in enumerate(
        zip(table["rg_digest"].to_pylist(), table["rg_rows"].to_pylist(), strict=True)
    ):
        for g, (d, n) in enumerate(zip(digests, sizes, strict=False)):
            if n > 0:
                seen.setdefault(d, []).append((f, g))
    pairs = []
    for members in seen.values():
        if len(members) < 2 or all(has_sid[f] for f, _ in members):
            continue
        (fa, ga), (fb, gb) = members[:2]
        more = f" (and {len(members) - 2} more)" if len(members) > 2 else ""
        pairs.append(f"{files[fa]} row group {ga} and {files[fb]} row group {gb}{more}")
    if pairs:
        raise DataError(
            f"{len(pairs)} row group(s) appear twice with identical input_ids: "
            + "; ".join(pairs[:5])
            + ". A shard is probably copied (a backup beside the original): remove the copy, "
            "or select the shards with data.glob"
        )


def validate(table: pa.Table, files: list[str], opts: DataOptions, default_q: str) -> Validated:
    """Apply contract 10 to the scan table: raise, or quarantine and count the bad rows."""
    r = _reasons(table, opts)
    records = _records(table, files, r, opts)
    qpath = None
    if records:
        if not opts.quarantine:
            raise DataError(_error_message(records, opts.path))
        qpath = opts.quarantine_path or default_q
        _write_quarantine(qpath, records)
        bad_rows = sum(1 for rec in records if rec[1] is not None)
        log.warning(
            "data: quarantined %d bad rows and %d unusable files to %s (data.on_bad_rows=quarantine)",
            bad_rows,
            len(records) - bad_rows,
            qpath,
        )
    keep = r["reason"] == 0
    if records and not keep.any():
        total = int(np.maximum(table["num_rows"].to_numpy(), 0).sum())
        raise DataError(
            f"every row of {opts.path} was quarantined ({len(records)} records: "
            f"{int((r['reason'] > 0).sum())} bad rows of {total}, "
            f"{len(records) - int((r['reason'] > 0).sum())} unusable files; reasons in {qpath}): "
            "nothing is left to train on; fix the data"
        )
    return Validated(
        keep, r["sid"], r["length"], r["fidx"], r["rows"], len(records), qpath, r["row_hash"]
    )


def _records(table: pa.Table, files: list[str], r: dict, opts: DataOptions) -> list[tuple]:
    """(file, row group, row, sample_id, num_rows, reason code, reason) per problem."""
    errors = table["error"].to_pylist()
    nrows = table["num_rows"].to_pylist()
    out = []
    for i, err in enumerate(errors):
        if err is not None:
            whole = f"whole file{'' if nrows[i] < 0 else f', {nrows[i]} rows'}"
            out.append((files[i], None, None, None, nrows[i], "UNUSABLE_FILE", f"{err} ({whole})"))
    bad = np.flatnonzero(r["reason"] > 0)
    groups = _row_groups_of(table["rg_rows"].to_pylist(), r["fidx"][bad], r["rows"][bad])
    for i, g in zip(bad.tolist(), groups.tolist(), strict=True):  # bad rows only
        code = Reason(int(r["reason"][i]))
        fo = int(r["first_of"][i])
        text = code.text(
            length=int(r["length"][i]),
            top=opts.top,
            min_id=int(r["mins"][i]),
            max_id=int(r["maxs"][i]),
            vocab=opts.vocab_size,
            sid=int(r["sid"][i]),
            first_file=files[r["fidx"][fo]],
            first_row=int(r["rows"][fo]),
        )
        sid = None if code in _NO_SID else int(r["sid"][i])
        out.append((files[r["fidx"][i]], g, int(r["rows"][i]), sid, 1, code.name, text))
    return out


def _error_message(records: list[tuple], path: str, limit: int = 20) -> str:
    lines = [
        f"bad input in {path}: {len(records)} problem(s) (data.on_bad_rows=error). "
        "Fix the data, or set data.on_bad_rows=quarantine to write them with reasons to a "
        "quarantine parquet and train without them:"
    ]
    for file, group, row, sid, _, _, reason in records[:limit]:
        if row is None:
            lines.append(f"  {file}: {reason}")
        else:
            who = "sample_id null" if sid is None else f"sample_id {sid}"
            lines.append(f"  {file}: {who} (row group {group}, row {row}): {reason}")
    if len(records) > limit:
        lines.append(f"  ... and {len(records) - limit} more")
    return "\n".join(lines)


def _write_quarantine(qpath: str, records: list[tuple]) -> None:
    file, group, row, sid, nrows, code, reason = zip(*records, strict=True)
    table = pa.table(
        {
            "file": pa.array(file, pa.string()),
            "row_group": pa.array(group, pa.int64()),
            "row": pa.array(row, pa.int64()),
            "sample_id": pa.array(sid, pa.int64()),
            "num_rows": pa.array(nrows, pa.int64()),
            "reason_code": pa.array(code, pa.string()),
            "reason": pa.array(reason, pa.string()),
        }
    )
    try:
        fs, p = filesystem_for(qpath)
        parent = p.rsplit("/", 1)[0] if "/" in p else ""
        if parent:
            fs.create_dir(parent, recursive=True)
        pq.write_table(table, p, filesystem=fs)
    except OSError as e:
        raise DataError(
            f"cannot write the quarantine parquet {qpath} ({type(e).__name__}: {e}): set "
            "data.quarantine_path to a writable file path"
        ) from e
