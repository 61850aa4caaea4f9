"""The data layer's user-facing error: bad or unreachable input, named by file, row and fix."""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """Bad input data, named by file, row group, sample id and reason (contract 10)."""
