"""Argument types shared by the job CLIs: a bad count is refused by argparse, naming the flag."""

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
