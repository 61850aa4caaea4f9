"""Arguments shared by the job CLIs: counts refused by argparse naming the flag, and `--set`."""

from __future__ import annotations

import argparse


def count(minimum: int):
    """argparse type: an integer >= `minimum`."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}")
        return v

    parse.__name__ = f"integer >= {minimum}"
    return parse


def add_overrides(ap: argparse.ArgumentParser, help: str = "override a config field (repeatable)"):
    """`--set KEY=VALUE`, repeatable, collected in `args.overrides` (typed by the config)."""
    ap.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help
    )
