"""Conversations for `jobs.tokenize`: each document is a list of {role, content} messages,
rendered by a tokenizer folder's chat template; its shard gets a `loss_mask` (int8) that is 1
exactly on the assistant's turns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.data.corpus import token_table
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
from pipeline.data.tokenize_text import TokenizeFiles

__all__ = [
    "TokenizeConversations",
    "conversation_ids_and_mask",
    "conversations",
    "load_chat_tokenizer",
]


def load_chat_tokenizer(folder: str):
    """The folder's `transformers` tokenizer, for its chat template only (no download, no
    remote code)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise TokenizeError(
            "conversations need `transformers` for the chat template: pip install 'bucketray[hf]'"
        ) from None
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    if not getattr(tok, "chat_template", None):
        raise TokenizeError(
            f"tokenizer folder {folder} has no chat template (tokenizer_config.json "
            "chat_template or chat_template.jinja): conversations cannot be rendered"
        )
    return tok


def _check_messages(v) -> str | None:
    """Why `v` is not a conversation (a list of {role, content} with string values), or None."""
    if not isinstance(v, list) or not v:
        return f"not a non-empty list of messages ({type(v).__name__})"
    for i, m in enumerate(v):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return f"message {i} has no role"
        if not isinstance(m.get("content"), str):
            return f"message {i} content is not text"
    if not any(m["role"] == "assistant" for m in v):
        return "no assistant message: nothing to train on"
    return None


def conversation_ids_and_mask(chat, tok, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of `messages` rendered by the chat template, and a loss mask that is 1 exactly on
    the tokens of the assistant's turns (their content and the template's end-of-turn text).

    Each assistant turn i spans from the end of render(messages[:i], add_generation_prompt) to
    the end of render(messages[:i+1]); both must be prefixes of the whole render, or the template
    is one whose spans cannot be read this way (ValueError). A token is masked when its first
    character falls in a span. `tok` is the `tokenizers.Tokenizer` (offsets), `chat` the
    `transformers` tokenizer holding the template."""

    def render(msgs, gen=False) -> str:
        return chat.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    full = render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = render(messages[:i], gen=True) if i else ""
        end = render(messages[: i + 1])
        if not (full.startswith(start) and full.startswith(end) and len(start) <= len(end)):
            raise ValueError("the chat template does not render turns as prefixes of the whole")
        spans.append((len(start), len(end)))
    # The template writes its special tokens (BOS, turn markers) as text: no second BOS.
    enc = tok.encode(full, add_special_tokens=False)
    ids = np.asarray(enc.ids, dtype=np.int32)
    first = np.fromiter((o[0] for o in enc.offsets), dtype=np.int64, count=len(enc.offsets))
    mask = np.zeros(ids.size, dtype=np.int8)
    for s, e in spans:
        mask[(first >= s) & (first < e)] = 1
    return ids, mask


def conversations(data: bytes, rel: str, column: str) -> tuple[list[int], list, list[tuple]]:
    """(rows, conversations, problems) of one .jsonl/.json/.parquet file; `column` holds a list
    of {role, content} messages."""
    if rel.endswith(".txt"):
        return [], [], [(0, "undecodable", "a .txt file holds no messages")]
    values = column_values(data, rel, column, "--messages-column", "the list of messages")
    rows, convs, problems = [], [], []
    for row, v in enumerate(values):
        if (problem := unusable(row, v, column, "messages")) is not None:
            problems.append(problem)
        elif (why := _check_messages(v)) is not None:
            problems.append((row, "undecodable", why))
        else:
            rows.append(row)
            convs.append(v)
    return rows, convs, problems


class TokenizeConversations(TokenizeFiles):
    """Like TokenizeFiles, for conversation data: each document is a list of messages, rendered
    by the folder's chat template; shards get a `loss_mask` (int8) beside `input_ids`."""

    def __init__(self, tokenizer: str, src: str, out: str, column: str, special: bool):
        tj, folder = resolve_tokenizer(tokenizer)
        super().__init__(tj, src, out, column, special)
        self.chat = load_chat_tokenizer(folder)

    def _one(self, ordinal: int, rel: str, prefix: str = "shard") -> dict:
        try:
            rows, convs, problems = conversations(read_input(self.src, rel), rel, self.column)
        except TokenizeError as e:
            return error_result(rel, e)
        kept_rows, ids, masks = [], [], []
        for row, conv in zip(rows, convs, strict=True):
            try:
                i, m = conversation_ids_and_mask(self.chat, self.tok, conv)
            except Exception as e:  # a template error on this conversation: counted, listed
                problems.append((row, "undecodable", f"chat template: {e}"))
                continue
            if i.size == 0:
                problems.append((row, "empty", "no tokens"))
                continue
            kept_rows.append(row)
            ids.append(i)
            masks.append(m)
        lengths = np.fromiter((a.size for a in ids), dtype=np.int64, count=len(ids))
        if ids:
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            sids = np.array([self.sample_id(rel, r) for r in kept_rows], dtype=np.int64)
            table = token_table(sids, np.concatenate(ids), offsets)
            mask = pa.ListArray.from_arrays(
                pa.array(offsets.astype(np.int32)), pa.array(np.concatenate(masks))
            )
            write_shard(self.out, ordinal, table.append_column("loss_mask", mask), prefix)
        return file_result(rel, lengths.tolist(), problems, [token_hash(i) for i in ids])
