"""Tokenize your own text into bucketray's parquet shards with a local tokenizer.json.

    python -m jobs.tokenize --input DIR_OR_URI --tokenizer tokenizer.json --out DIR
    python -m jobs.tokenize --input DIR --tokenizer TOKENIZER_DIR --messages-column messages --out DIR

Reads .jsonl/.json/.parquet/.txt files (the text field: --text-column), writes shard-*.parquet
(sample_id, input_ids) under --out (with --heldout FRACTION: train-*.parquet and, that fraction
of the source files held out, validation-*.parquet, for `eval.split: validation`), prints a summary (samples, tokens, length percentiles,
empty and undecodable documents, every input file skipped and why) and optionally the length histogram (--png). Runs on the Ray
cluster named by RAY_ADDRESS, or on local Ray. See pipeline/data/tokenize.py.
"""

from __future__ import annotations

import argparse
import json

from pipeline.core.config import ConfigError
from pipeline.data.tokenize import MARKER, TokenizeError, tokenize_dataset


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m jobs.tokenize", description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="directory, file or URI (s3://...) of text files")
    p.add_argument(
        "--tokenizer",
        required=True,
        help="local tokenizer.json (Hugging Face format), or the folder AutoTokenizer."
        "save_pretrained writes (tokenizer.json, tokenizer_config.json, chat template)",
    )
    p.add_argument("--out", required=True, help="output directory or URI (empty, or ours)")
    p.add_argument(
        "--text-column", default="text", help="JSON field / parquet column with the text"
    )
    p.add_argument(
        "--no-special-tokens",
        action="store_true",
        help="do not add the tokenizer's special tokens (BOS/EOS from its post-processor)",
    )
    p.add_argument(
        "--messages-column",
        help="conversation data: the field / column holding a list of {role, content} messages, "
        "rendered by the tokenizer folder's chat template; shards get a loss_mask that is 1 on "
        "the assistant's turns only",
    )
    p.add_argument(
        "--heldout",
        type=_fraction,
        default=0.0,
        metavar="FRACTION",
        help="hold out about this fraction of the source files (whole files, chosen by a stable "
        "hash of their paths) as split `validation` beside split `train`, for the config's "
        "eval.split: validation (e.g. 0.05)",
    )
    p.add_argument("--png", help="write the length histogram to this PNG")
    a = p.parse_args(argv)
    import logging

    import ray

    from pipeline.data.connect import connect

    started = not ray.is_initialized()
    logging.getLogger("ray").setLevel(logging.ERROR)  # Ray's start-up lines: the job has its own
    try:  # RAY_ADDRESS (`ray job submit`) or a private local instance, never a stale address file
        connect(log_to_driver=False, include_dashboard=False, logging_level=logging.ERROR)
    except ConfigError as e:
        p.exit(2, f"tokenize: {e}\n")
    try:
        summary = tokenize_dataset(
            a.input,
            a.tokenizer,
            a.out,
            text_column=a.text_column,
            add_special_tokens=not a.no_special_tokens,
            png=a.png,
            messages_column=a.messages_column,
            heldout=a.heldout,
        )
    except TokenizeError as e:
        p.exit(2, f"tokenize: {e}\n")
    finally:
        if started:
            ray.shutdown()
    print(json.dumps(summary))
    print(f"tokenize: set model.vocab_size: {summary['vocab_size']} and data.path: {a.out}")
    if a.heldout:
        print(
            f"tokenize: held out {len(summary['heldout_files'])} of {summary['files']} files "
            f"({summary['heldout_samples']:,} samples, {summary['train_samples']:,} left to "
            f"train on; {summary['heldout_duplicates_dropped']:,} held-out documents with a "
            "training document's exact tokens dropped) as split validation: the config's "
            "eval.split: validation evaluates them"
        )
    _print_skipped_files(summary)
    if summary["empty"] or summary["undecodable"]:
        print(
            f"tokenize: skipped {summary['empty']} empty and {summary['undecodable']} undecodable "
            f"documents, e.g. {summary['problems'][:3]} (counts complete; the first ones are listed in {a.out}/{MARKER})"
        )
    return summary


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a fraction of the source files between 0 and 1, e.g. 0.05"
        )
    return value


def _print_skipped_files(summary: dict) -> None:
    """Every input file not used, with its reason (also in the summary's `skipped`)."""
    skipped = summary.get("skipped") or []
    if skipped:
        listed = "; ".join(f"{path} ({why})" for path, why in skipped)
        print(f"tokenize: skipped {len(skipped)} input files: {listed}")


if __name__ == "__main__":
    main()
