"""A real-text corpus with no download: the running interpreter's standard-library source.

Every machine that runs bucketray has it. `write_text_corpus` walks the stdlib directory
(`sysconfig.get_paths()["stdlib"]`) in sorted order, skipping test suites (directories named
`test`, `tests`, `idle_test`), `site-packages` and files that do not parse, and splits each module
with `ast` into samples:

- every top-level function (decorators included),
- every method of a top-level class (one sample per method, decorators included),
- every top-level class header: from the `class` line (decorators included) up to the line
  before its first method (the whole class when it has none).

Module-level statements between definitions and class statements after the first method are not
samples. Tokens are bytes by default: id = byte + 3, with 0 = padding, 1 = BOS and 2 = EOS, so a
sample is [BOS, utf-8 bytes + 3, EOS] and the vocabulary is 259 (`BYTE_VOCAB`). With a local
`tokenizer.json` (Hugging Face `tokenizers` format, the library must be installed) the text is
encoded with it instead, without special tokens added.

Sample ids are a 62-bit hash of (file path relative to the stdlib, first line): stable for an
unchanged definition whatever else changes. Shards have the layout of `pipeline.data.corpus`
(`sample_id` int64, `input_ids` list<int32>); `_manifest.parquet` maps each id to its file, line
span, kind and name, and the marker records the Python version, because the corpus differs
between Python versions. Pure: no Ray, no torch.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.data.corpus import ROW_GROUP_ROWS, clear_output, token_table

__all__ = [
    "BYTE_VOCAB",
    "BOS_ID",
    "EOS_ID",
    "MANIFEST",
    "TEXT_MARKER",
    "TEXT_PRESETS",
    "Snippet",
    "byte_tokens",
    "heldout_files",
    "split_source",
    "stable_id",
    "stdlib_root",
    "text_corpus_is_current",
    "write_text_corpus",
]

TEXT_PRESETS = ("pystdlib",)
PAD_ID, BOS_ID, EOS_ID, BYTE_OFFSET = 0, 1, 2, 3
BYTE_VOCAB = 256 + BYTE_OFFSET
# Both start with "_" so the shard listing (index.list_shards) skips them.
TEXT_MARKER = "_bucketray_text.json"
MANIFEST = "_manifest.parquet"
SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)


@dataclass(frozen=True)
class Snippet:
    """One sample: lines [start, end] (1-based, inclusive) of `file`."""

    file: str
    start: int
    end: int
    kind: str  # "function", "method" or "class"
    name: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stable_id(*parts: object) -> int:
    """A non-negative 62-bit id from a hash of `parts` (same parts, same id, on any machine)."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 2


def _start(node: ast.AST) -> int:
    decos = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decos])


def split_source(source: str, file: str) -> list[Snippet]:
    """Top-level functions, methods and class headers of one module (raises SyntaxError)."""
    out = []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.parse(source).body:
        if isinstance(node, defs):
            out.append(Snippet(file, _start(node), node.end_lineno, "function", node.name))
        elif isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, defs)]
            end = _start(methods[0]) - 1 if methods else node.end_lineno
            out.append(Snippet(file, _start(node), end, "class", node.name))
            for m in methods:
                name = f"{node.name}.{m.name}"
                out.append(Snippet(file, _start(m), m.end_lineno, "method", name))
    return out


def _source_files(root: Path) -> list[Path]:
    files = (p for p in root.rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(root).parts))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _collect(root: Path) -> tuple[list[Snippet], list[str], list[str]]:
    """Snippets and their texts over every source file under `root`; also the skipped files."""
    snippets, texts, skipped = [], [], []
    for path in _source_files(root):
        rel = path.relative_to(root).as_posix()
        try:
            source = path.read_bytes().decode("utf-8")
            found = split_source(source, rel)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            skipped.append(rel)
            continue
        lines = source.splitlines(keepends=True)
        for s in found:
            text = "".join(lines[s.start - 1 : s.end])
            if text.strip():
                snippets.append(s)
                texts.append(text)
    return snippets, texts, skipped


def byte_tokens(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Byte-level ids of `texts`: (flat int32 values, int64 offsets), each [BOS, bytes+3, EOS]."""
    raw = [t.encode("utf-8") for t in texts]
    lengths = np.fromiter((len(b) + 2 for b in raw), dtype=np.int64, count=len(raw))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    body = np.frombuffer(b"".join(raw), dtype=np.uint8).astype(np.int32) + BYTE_OFFSET
    values = np.empty(int(offsets[-1]), dtype=np.int32)
    values[offsets[:-1]] = BOS_ID
    values[offsets[1:] - 1] = EOS_ID
    inner = np.ones(values.size, dtype=bool)
    inner[offsets[:-1]] = False
    inner[offsets[1:] - 1] = False
    values[inner] = body
    return values, offsets


def _tokenizer_tokens(texts: list[str], tokenizer: str) -> tuple[np.ndarray, np.ndarray, int]:
    try:
        from tokenizers import Tokenizer
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "a tokenizer.json needs the `tokenizers` library: pip install 'bucketray[hf]'"
        ) from e
    tok = Tokenizer.from_file(str(tokenizer))
    encs = tok.encode_batch(texts, add_special_tokens=False)
    ids = [np.asarray(e.ids, dtype=np.int32) for e in encs]
    lengths = np.fromiter((a.size for a in ids), dtype=np.int64, count=len(ids))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.concatenate(ids) if ids else np.empty(0, np.int32)
    return values, offsets, tok.get_vocab_size(with_added_tokens=True)


def _file_digest(path: str | None) -> str | None:
    return None if path is None else hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _params(
    preset: str,
    shards: int,
    root: str,
    tokenizer: str | None,
    max_samples: int | None = None,
    seed: int = 0,
    heldout: float = 0.0,
) -> dict:
    extra = {"heldout": float(heldout)} if heldout else {}  # corpora without one stay current
    return {
        **extra,
        "version": 1,
        "preset": preset,
        "python": ".".join(map(str, sys.version_info[:3])),
        "root": str(root),
        "shards": int(shards),
        "tokenizer_sha256": _file_digest(tokenizer),
        "max_samples": None if max_samples is None else int(max_samples),
        "subset_seed": int(seed),
    }


def subset(n: int, max_samples: int | None, seed: int) -> np.ndarray:
    """Which of `n` definitions the corpus keeps: all, or `max_samples` of them drawn with
    `seed`, in their source order (so a subset is spread over the whole library)."""
    if max_samples is None or max_samples >= n:
        return np.arange(n)
    rng = np.random.default_rng((int(seed), n))
    return np.sort(rng.choice(n, size=int(max_samples), replace=False))


def text_corpus_is_current(
    out_dir: str | Path,
    *,
    preset: str = "pystdlib",
    shards: int = 4,
    root: str | None = None,
    tokenizer: str | None = None,
    max_samples: int | None = None,
    seed: int = 0,
    heldout: float = 0.0,
) -> bool:
    """True when `out_dir` holds a complete corpus built with these parameters by this Python."""
    marker = Path(out_dir) / TEXT_MARKER
    if not marker.is_file():
        return False
    try:
        found = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    want = _params(
        preset, shards, str(root or stdlib_root()), tokenizer, max_samples, seed, heldout
    )
    return {k: found.get(k) for k in want} == want


def _write_shards(
    out: Path,
    ids: np.ndarray,
    values: np.ndarray,
    offsets: np.ndarray,
    shards: int,
    prefix: str = "shard",
) -> None:
    """`shards` contiguous Parquet shards of (sample_id, input_ids) named `<prefix>-00000...`."""
    n = ids.size
    bounds = np.linspace(0, n, shards + 1).round().astype(np.int64)
    for s in range(shards):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        table = token_table(ids[lo:hi], values, offsets[lo : hi + 1])
        pq.write_table(table, out / f"{prefix}-{s:05d}.parquet", row_group_size=ROW_GROUP_ROWS)


def heldout_files(files: list[str], fraction: float) -> set[str]:
    """The source files held out for evaluation: each file by a stable hash of its path, so
    about `fraction` of the files, the same on every machine and for every subset."""
    if fraction <= 0:
        return set()
    return {f for f in set(files) if stable_id("heldout", f) < fraction * 2**62}


def _split_heldout(
    snippets: list[Snippet], values: np.ndarray, offsets: np.ndarray, fraction: float
) -> tuple[np.ndarray, np.ndarray, int]:
    """(training positions, held-out positions, held-out samples dropped because a training
    sample has the same tokens): held-out files are never trained on, and no held-out sample
    repeats a training one."""
    held = heldout_files([s.file for s in snippets], fraction)
    is_held = np.array([s.file in held for s in snippets], dtype=bool)
    train, test = np.flatnonzero(~is_held), np.flatnonzero(is_held)

    def text(i: int) -> bytes:
        return values[offsets[i] : offsets[i + 1]].tobytes()

    seen = {text(i) for i in train}
    unique = np.array([i for i in test if text(i) not in seen], dtype=np.int64)
    return train, unique, int(test.size - unique.size)


def _write_split(
    out: Path,
    ids: np.ndarray,
    values: np.ndarray,
    offsets: np.ndarray,
    positions: np.ndarray,
    shards: int,
    prefix: str,
) -> None:
    lens = np.diff(offsets)[positions]
    starts = offsets[positions]
    sub_off = np.concatenate([[0], np.cumsum(lens)])
    idx = np.repeat(starts - sub_off[:-1], lens) + np.arange(int(sub_off[-1]))
    _write_shards(out, ids[positions], values[idx], sub_off, shards, prefix)


def _write_manifest(
    out: Path, snippets: list[Snippet], ids: np.ndarray, lengths: np.ndarray
) -> None:
    """The manifest: where each sample comes from (file, lines, kind, name) and its length."""
    manifest = pa.table(
        {
            "sample_id": pa.array(ids),
            "file": pa.array([s.file for s in snippets]),
            "start_line": pa.array([s.start for s in snippets], pa.int32()),
            "end_line": pa.array([s.end for s in snippets], pa.int32()),
            "kind": pa.array([s.kind for s in snippets]),
            "name": pa.array([s.name for s in snippets]),
            "num_tokens": pa.array(lengths, pa.int32()),
        }
    )
    pq.write_table(manifest, out / MANIFEST)


def write_text_corpus(
    out_dir: str | Path,
    *,
    preset: str = "pystdlib",
    shards: int = 4,
    root: str | None = None,
    tokenizer: str | None = None,
    max_samples: int | None = None,
    seed: int = 0,
    heldout: float = 0.0,
    progress: bool = True,
) -> dict:
    """Build the corpus into `out_dir` (idempotent); returns a summary with the marker's fields.

    `root` replaces the stdlib directory (tests use a small one); `tokenizer` is a local
    tokenizer.json used instead of bytes; `max_samples` keeps at most that many definitions, a
    subset drawn with `seed` (`subset`); `heldout` > 0 holds out that fraction of the source
    files (`heldout_files`) as split `validation` and writes the rest as split `train`.
    """
    if preset not in TEXT_PRESETS:
        raise ValueError(f"unknown text preset {preset!r}: choose one of {list(TEXT_PRESETS)}")
    if shards < 1:
        raise ValueError(f"shards must be >= 1: got {shards}")
    src = Path(root) if root is not None else stdlib_root()
    if not src.is_dir():
        raise FileNotFoundError(f"source directory not found: {src}")
    out = Path(out_dir)
    params = _params(preset, shards, str(src), tokenizer, max_samples, seed, heldout)
    if text_corpus_is_current(
        out,
        preset=preset,
        shards=shards,
        root=str(src),
        tokenizer=tokenizer,
        max_samples=max_samples,
        seed=seed,
        heldout=heldout,
    ):
        summary = json.loads((out / TEXT_MARKER).read_text())
        return {**summary, "skipped": True, "out_dir": str(out)}
    marker = out / TEXT_MARKER
    clear_output(out, marker, writer="bucketray", choose="an empty output directory")

    t0 = time.perf_counter()
    snippets, texts, skipped = _collect(src)
    if not snippets:
        raise ValueError(f"no functions, methods or classes found under {src}")
    found = len(snippets)
    keep = subset(found, max_samples, seed)
    snippets, texts = [snippets[i] for i in keep], [texts[i] for i in keep]
    ids = np.array([stable_id(s.file, s.start) for s in snippets], dtype=np.int64)
    if np.unique(ids).size != ids.size:  # pragma: no cover - a 62-bit hash collision
        raise AssertionError("sample id collision in the text corpus")
    if tokenizer is not None:
        values, offsets, vocab = _tokenizer_tokens(texts, tokenizer)
    else:
        (values, offsets), vocab = byte_tokens(texts), BYTE_VOCAB
    n = len(snippets)
    lengths = np.diff(offsets)
    split_info = _write_all(out, snippets, ids, values, offsets, shards=shards, heldout=heldout)
    summary = {
        **params,
        "samples": n,
        "definitions_found": found,
        "tokens": int(offsets[-1]),
        "files_read": len({s.file for s in snippets}),
        "files_skipped": skipped,
        "vocab_size": int(vocab),
        "max_length": int(lengths.max()),
        "median_length": float(np.median(lengths)),
        **split_info,
    }
    marker.write_text(json.dumps(summary))
    if progress:
        print(_summary_line(summary, time.perf_counter() - t0, out), file=sys.stderr, flush=True)
    return {**summary, "skipped": False, "out_dir": str(out)}


def _write_all(out: Path, snippets, ids, values, offsets, *, shards: int, heldout: float) -> dict:
    """The shards (with `heldout` > 0: split `train` and split `validation`, held out by source
    file) and the manifest; the split's counts for the summary ({} without a held-out split)."""
    split_info = {}
    if heldout:
        train, test, dropped = _split_heldout(snippets, values, offsets, heldout)
        if not train.size or not test.size:
            raise ValueError(
                f"heldout={heldout} leaves {train.size} training and {test.size} held-out "
                "samples: choose a fraction that leaves both non-empty"
            )
        _write_split(out, ids, values, offsets, train, min(shards, train.size), "train")
        _write_split(out, ids, values, offsets, test, 1, "validation")
        split_info = {"train_samples": int(train.size), "heldout_samples": int(test.size),
                      "heldout_duplicates_dropped": dropped}  # fmt: skip
    else:
        _write_shards(out, ids, values, offsets, min(shards, len(snippets)))
    _write_manifest(out, snippets, ids, np.diff(offsets))
    return split_info


def _summary_line(summary: dict, seconds: float, out: Path) -> str:
    """The one console line a build prints."""
    n, found = summary["samples"], summary["definitions_found"]
    of = f" (a subset of {found:,})" if n < found else ""
    if "train_samples" in summary:
        of += (
            f" ({summary['train_samples']:,} train, {summary['heldout_samples']:,} "
            "held out by source file)"
        )
    return (
        f"textcorpus: {n:,} samples{of}, {summary['tokens']:,} tokens from "
        f"{summary['files_read']} files ({len(summary['files_skipped'])} skipped) in "
        f"{seconds:.1f} s -> {out}"
    )
