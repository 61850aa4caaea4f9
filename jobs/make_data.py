"""Write the seed-calibrated synthetic corpus: `python -m jobs.make_data --preset seed902k --out DIR`.

A bad argument or an output directory that is not ours is one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from jobs._cli import count
from pipeline.core.synthetic import PRESETS
from pipeline.data.corpus import write_corpus

PROG = "python -m jobs.make_data"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument(
        "--preset", choices=sorted(PRESETS), default="seed902k", help="length distribution"
    )
    p.add_argument("--out", required=True, help="output directory (created; must be empty or ours)")
    p.add_argument(
        "--num-samples", type=count(1), default=None, help="samples (default: the preset's 902,087)"
    )
    p.add_argument("--shards", type=count(1), default=32, help="parquet files to write")
    p.add_argument(
        "--vocab-size", type=count(2), default=512, help="token ids are < this (model.vocab_size)"
    )
    p.add_argument(
        "--corpus-seed",
        type=count(0),
        default=0,
        help="corpus generator seed (data.synthetic.seed): same seed, same corpus",
    )
    return p


def main(argv: list[str] | None = None) -> dict:
    """Write the corpus and return its summary; a user error exits 2 with one line on stderr."""
    a = build_parser().parse_args(argv)
    try:
        summary = write_corpus(
            a.out,
            preset=a.preset,
            num_samples=a.num_samples,
            shards=a.shards,
            vocab_size=a.vocab_size,
            seed=a.corpus_seed,
            progress=True,
        )
    except (FileExistsError, ValueError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as err:
        print(f"{PROG}: error: cannot write --out {a.out}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
