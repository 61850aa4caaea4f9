"""Plain text for `jobs.tokenize`: a document is one JSON line or parquet row's text field, or a
whole `.txt` file, encoded by a `tokenizer.json` into one shard per input file."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.data.corpus import token_table
from pipeline.data.textcorpus import stable_id
from pipeline.data.tokenize_io import (
    TokenizeError,
    column_values,
    error_result,
    file_result,
    read_input,
    resolve_tokenizer,
    unusable,
    write_shard,
)
from pipeline.data.tokenize_split import token_hash

__all__ = ["TokenizeFiles", "text_documents"]


def text_documents(data: bytes, rel: str, column: str) -> tuple[list[int], list[str], list[tuple]]:
    """(rows, texts, problems) of one file; a problem is (row, kind, reason)."""
    rows, texts, problems = [], [], []
    if rel.endswith(".txt"):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            return [], [], [(0, "undecodable", f"not UTF-8 ({e.reason} at byte {e.start})")]
        return ([0], [text], []) if text.strip() else ([], [], [(0, "empty", "empty text")])
    values = column_values(data, rel, column, "--text-column", "the text")
    for row, v in enumerate(values):
        if isinstance(v, str) and not v.strip():  # else encoded as a bare [BOS][EOS] sample
            problems.append((row, "empty", "empty text"))
        elif isinstance(v, str):
            rows.append(row)
            texts.append(v)
        else:
            problems.append(
                unusable(row, v, column, "text")
                or (row, "undecodable", f"{column!r} is {type(v).__name__}, not text")
            )
    return rows, texts, problems


class TokenizeFiles:
    """Ray Data map_batches actor: tokenizes whole input files, writes one shard per file."""

    def __init__(self, tokenizer: str, src: str, out: str, column: str, special: bool):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(resolve_tokenizer(tokenizer)[0])
        self.src, self.out = src, out
        self.column, self.special = column, special

    def __call__(self, batch: pa.Table) -> pa.Table:
        ordinals, rels = batch["ordinal"].to_pylist(), batch["rel"].to_pylist()
        prefixes = batch["prefix"].to_pylist()
        results = [
            self._one(i, rel, prefix)
            for i, rel, prefix in zip(ordinals, rels, prefixes, strict=True)
        ]
        return pa.table(
            {
                "ordinal": pa.array(ordinals, pa.int64()),
                "file": [r["file"] for r in results],
                "lengths": pa.array([r["lengths"] for r in results], pa.list_(pa.int64())),
                "hashes": pa.array([r["hashes"] for r in results], pa.list_(pa.int64())),
                "empty": pa.array([r["empty"] for r in results], pa.int64()),
                "undecodable": pa.array([r["undecodable"] for r in results], pa.int64()),
                "problems": [r.get("problems", "[]") for r in results],
                "error": [r["error"] for r in results],
            }
        )

    def sample_id(self, rel: str, row: int) -> int:
        """A document's id: its input root (the absolute path or URI tokenized), its path under
        it and its row, so re-tokenizing the same input gives the same ids, and two folders
        tokenized apart (a held-out `lines.jsonl` beside a training one) never share one."""
        return stable_id(self.src, rel, row)

    def _one(self, ordinal: int, rel: str, prefix: str = "shard") -> dict:
        try:
            rows, texts, problems = text_documents(read_input(self.src, rel), rel, self.column)
        except TokenizeError as e:  # a user mistake: reported by the driver in one line
            return error_result(rel, e)
        encs = self.tok.encode_batch(texts, add_special_tokens=self.special) if texts else []
        ids = [np.asarray(e.ids, dtype=np.int32) for e in encs]
        lengths = np.fromiter((a.size for a in ids), dtype=np.int64, count=len(ids))
        problems += [(rows[i], "empty", "no tokens") for i in np.flatnonzero(lengths == 0)]
        keep = np.flatnonzero(lengths > 0)
        if keep.size:
            offsets = np.concatenate([[0], np.cumsum(lengths[keep])])
            values = np.concatenate([ids[i] for i in keep])
            sids = np.array([self.sample_id(rel, rows[i]) for i in keep], dtype=np.int64)
            write_shard(self.out, ordinal, token_table(sids, values, offsets), prefix)
        hashes = [token_hash(ids[i]) for i in keep]
        return file_result(rel, lengths[keep].tolist(), problems, hashes)
