"""Write the seed-calibrated synthetic corpus: `python -m jobs.make_data --preset seed902k --out DIR`."""

from __future__ import annotations

import argparse
import json

from pipeline.core.corpus import write_corpus
from pipeline.core.synthetic import PRESETS


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m jobs.make_data", description=__doc__)
    p.add_argument(
        "--preset", choices=sorted(PRESETS), default="seed902k", help="length distribution"
    )
    p.add_argument("--out", required=True, help="output directory (created; must be empty or ours)")
    p.add_argument(
        "--num-samples", type=int, default=None, help="samples (default: the preset's 902,087)"
    )
    p.add_argument("--shards", type=int, default=32, help="parquet files to write")
    p.add_argument(
        "--vocab-size", type=int, default=512, help="token ids are < this (model.vocab_size)"
    )
    p.add_argument("--seed", type=int, default=0, help="same seed, same corpus")
    a = p.parse_args(argv)
    summary = write_corpus(
        a.out,
        preset=a.preset,
        num_samples=a.num_samples,
        shards=a.shards,
        vocab_size=a.vocab_size,
        seed=a.seed,
        progress=True,
    )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
