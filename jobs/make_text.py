"""Build the real-text corpus: `python -m jobs.make_text --preset pystdlib --out DIR`.

This Python's standard-library source split into functions, methods and class headers, byte
tokens (vocab 259) or a local tokenizer.json; see pipeline/data/textcorpus.py.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.data.textcorpus import TEXT_PRESETS, write_text_corpus


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m jobs.make_text", description=__doc__)
    p.add_argument("--preset", choices=TEXT_PRESETS, default="pystdlib", help="text source")
    p.add_argument("--out", required=True, help="output directory (created; must be empty or ours)")
    p.add_argument("--shards", type=int, default=4, help="parquet files to write")
    p.add_argument("--root", default=None, help="source directory (default: this Python's stdlib)")
    p.add_argument(
        "--tokenizer", default=None, help="local tokenizer.json (default: byte tokens, vocab 259)"
    )
    a = p.parse_args(argv)
    try:
        summary = write_text_corpus(
            a.out, preset=a.preset, shards=a.shards, root=a.root, tokenizer=a.tokenizer
        )
    except (OSError, ValueError, ImportError) as e:
        p.exit(2, f"make_text: {e}\n")
    summary["files_skipped"] = len(summary["files_skipped"])
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    sys.exit(main() and 0)
