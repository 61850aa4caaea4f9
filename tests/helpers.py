"""What many tests share: one tiny, valid run config (every test that needs "some small run"
starts here), free local ports for servers a test starts, and a GET's HTTP status."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from pipeline.core.config import RunConfig, validate

__all__ = ["TINY_LLAMA", "free_ports", "http_status", "tiny_raw", "tiny_config", "write_held_out"]

# A two-layer Llama small enough for unit tests (grouped-query heads: 4 query, 2 key/value).
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free on 127.0.0.1 now. Every socket stays bound until all `n` are
    taken: asking one at a time can hand back the same port twice, and a server given one port
    for two of its components refuses to start."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def http_status(url: str, token: str | None) -> int:
    """HTTP status of a GET (with `token` as a bearer token), 0 while nothing listens yet."""
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


def tiny_raw(tmp_path: Path | str | None = None, **sections: dict) -> dict:
    """The tiny run as a plain dict: 600 synthetic samples cut at 64 tokens, two optimised
    buckets, a 1,024-token global budget, a 1-layer model, W&B disabled, 2 workers at 0.5 CPU.
    Files go under `tmp_path` (default: relative `tiny/`). Each keyword updates one section's
    fields, e.g. `train={"epochs": 1}`; a section given as None is removed. Giving a variant's
    key switches the section like a `--set` does: `batching={"mode": "fixed", ...}`,
    `buckets={"edges": [...]}`, `data={"path": ...}`."""
    tmp = Path(tmp_path) if tmp_path is not None else Path("tiny")
    raw = {
        "data": {
            "synthetic": {"num_samples": 600, "shards": 2, "out_dir": str(tmp / "data")},
            "max_length": 64,
            "over_length": "truncate",
        },
        "buckets": {"num_buckets": 2},
        "batching": {"token_budget": 1024},
        "model": {"vocab_size": 64, "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64},
        "train": {"epochs": 2, "lr": 1e-2, "warmup_steps": 5, "log_every": 5},
        "wandb": {"mode": "disabled"},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5},
        "checkpoint": {"storage_path": str(tmp / "runs"), "every_steps": 20, "keep_last": 2},
    }
    for name, values in sections.items():
        if values is None:
            raw.pop(name, None)
            continue
        old = dict(raw.get(name, {}))
        for key, drop in _SWITCHES.get(name, {}).items():
            if key in values:
                old = {k: v for k, v in old.items() if k not in drop}
        raw[name] = {**old, **values}
    return raw


# A variant's key, and the other variants' fields it drops from the tiny defaults.
_SWITCHES = {
    "batching": {"mode": {"token_budget", "round_to", "batch_size"}},
    "buckets": {"edges": {"num_buckets", "target_efficiency", "max_buckets"}},
    "data": {"path": {"synthetic"}},
    # A Hugging Face model takes its sizes from its own config: the tiny model's are dropped.
    "model": {
        k: {"d_model", "n_layers", "n_heads", "d_ff"} for k in ("hf_config", "hf_pretrained")
    },
}


def tiny_config(tmp_path: Path | str | None = None, **sections: dict) -> RunConfig:
    """`tiny_raw(...)`, validated."""
    return validate(tiny_raw(tmp_path, **sections))


def write_held_out(
    directory: Path | str, n: int = 40, *, max_length: int = 64, vocab: int = 64, seed: int = 7
) -> str:
    """A small held-out set for the tiny run: `n` samples drawn like the synthetic corpus's
    (the same learnable structure, corpus seed 0), lengths 2 to `max_length`, sample ids from
    10**9 on (never the training corpus's, so never its tokens either), one shard."""
    import numpy as np
    import pyarrow.parquet as pq

    from pipeline.core.synthetic import synthetic_tokens
    from pipeline.data.corpus import token_table

    lengths = np.random.default_rng(seed).integers(2, max_length + 1, n)
    ids = 10**9 + np.arange(n)
    values, offsets = synthetic_tokens(lengths, ids, vocab_size=vocab, seed=0)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(token_table(ids, values, offsets), d / "held-00000.parquet")
    return str(d)
