"""jobs.tokenize with a tokenizer folder (as AutoTokenizer.save_pretrained writes it) and
conversation data: the chat template renders each conversation, the loss mask covers exactly the
assistant's turns. The tokenizer is built by the test (no download); no Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.data.tokenize_chat import conversation_ids_and_mask, conversations
from pipeline.data.tokenize_io import TokenizeError, resolve_tokenizer

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

SPECIAL = ["[UNK]", "<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
WORDS = "hello how are you fine thanks what is two plus three five ok bye".split()
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CONV = [
    {"role": "system", "content": "be ok"},
    {"role": "user", "content": "hello how are you"},
    {"role": "assistant", "content": "fine thanks"},
    {"role": "user", "content": "what is two plus three"},
    {"role": "assistant", "content": "five"},
]


def save_tokenizer_folder(path) -> str:
    from tokenizers import models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", unk_token="[UNK]", eos_token="<|end|>"
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(path)
    return str(path)


def test_a_tokenizer_folder_or_a_bare_file_is_accepted(tmp_path):
    folder = save_tokenizer_folder(tmp_path / "tok")
    tj, d = resolve_tokenizer(folder)
    assert tj == f"{folder}/tokenizer.json" and d == folder
    assert resolve_tokenizer(tj) == (tj, None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizeError, match="has no tokenizer.json"):
        resolve_tokenizer(str(tmp_path / "empty"))


def test_loss_mask_covers_exactly_the_assistant_turns(tmp_path):
    from pipeline.data.tokenize_chat import load_chat_tokenizer

    folder = save_tokenizer_folder(tmp_path / "tok")
    chat = load_chat_tokenizer(folder)
    tok = tokenizers.Tokenizer.from_file(resolve_tokenizer(folder)[0])
    ids, mask = conversation_ids_and_mask(chat, tok, CONV)
    assert ids.dtype == np.int32 and mask.dtype == np.int8 and ids.shape == mask.shape
    words = [tok.id_to_token(int(i)) for i in ids]
    assert words[0] == "<s>" and words.count("<s>") == 1  # the template's BOS, not a second one
    supervised = [w for w, m in zip(words, mask, strict=True) if m]
    assert supervised == ["fine", "thanks", "<|end|>", "five", "<|end|>"]
    # Everything else (system, user turns, the assistant headers) is context only.
    assert "hello" in words and "<|assistant|>" in words
    assert not any(m for w, m in zip(words, mask, strict=True) if w == "<|assistant|>")


def test_bad_conversations_are_counted_with_their_reason():
    lines = [
        json.dumps({"messages": CONV}),
        json.dumps({"messages": [{"role": "user", "content": "hello"}]}),
        json.dumps({"text": "no messages"}),
        json.dumps({"messages": "hello"}),
        "",
        "{bad",
    ]
    rows, convs, problems = conversations("\n".join(lines).encode() + b"\n", "a.jsonl", "messages")
    assert rows == [0] and convs == [CONV]
    reasons = {row: why for row, _, why in problems}
    assert reasons[1] == "no assistant message: nothing to train on"
    assert reasons[2] == "no field 'messages'"
    assert reasons[3].startswith("not a non-empty list of messages")
    assert reasons[4] == "blank line or null messages"
    assert reasons[5].startswith("JSONDecodeError")
