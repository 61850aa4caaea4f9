"""Data delivery benchmark: `python -m jobs.bench_data [--num-samples 100000] [--consumers 2]`."""

from __future__ import annotations

import argparse
import json
import os


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not >= 1")
    return n


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m jobs.bench_data", description=__doc__)
    p.add_argument("--num-samples", type=positive_int, default=100_000, help="preset samples")
    p.add_argument(
        "--consumers", type=positive_int, default=2, help="ranks (Ray tasks) consuming the epoch"
    )
    p.add_argument("--shards", type=positive_int, default=8, help="parquet shards to write")
    p.add_argument(
        "--repeats", type=positive_int, default=3, help="epochs measured (medians are reported)"
    )
    p.add_argument("--data-dir", default=None, help="corpus directory (default data/bench/...)")
    p.add_argument(
        "--address", default="local", help="Ray address: local (private cluster) or auto"
    )
    p.add_argument("--json-out", default=None, help="also write the result JSON here")
    p.add_argument(
        "--chapter-tokens",
        default=None,
        help="instead: one cold epoch per chapter size, comma-separated (0: the whole epoch), "
        "e.g. 0,33554432; time to first micro-batch and object store peak",
    )
    a = p.parse_args(argv)
    if a.chapter_tokens is not None:
        return _chapters(a)
    from bench.delivery import measure_delivery  # after parsing: --help needs no Ray

    r = measure_delivery(
        a.num_samples,
        a.consumers,
        shards=a.shards,
        repeats=a.repeats,
        data_dir=a.data_dir,
        address=a.address,
    )
    width = max(len(k) for k in r)
    for k, v in r.items():
        shown = (
            f"{v:,.3f}" if isinstance(v, float) else (f"{v:,}" if isinstance(v, int) else str(v))
        )
        print(f"{k:<{width}}  {shown}")
    print(json.dumps(r))
    if a.json_out:  # written beside, then moved into place
        tmp = f"{a.json_out}.tmp"
        with open(tmp, "w") as f:
            json.dump(r, f, indent=2)
        os.replace(tmp, a.json_out)
    return r


def _chapters(a: argparse.Namespace) -> dict:
    from bench.delivery import measure_chapters

    try:
        sizes = [int(x) or None for x in a.chapter_tokens.split(",")]
    except ValueError:
        raise SystemExit(
            f"--chapter-tokens: expected comma-separated integers, got {a.chapter_tokens!r}"
        ) from None
    rows = measure_chapters(a.num_samples, a.consumers, sizes, shards=a.shards, data_dir=a.data_dir)
    for row in rows:
        print(json.dumps(row))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(rows, f, indent=2)
    return {"chapters": rows}


if __name__ == "__main__":
    main()
