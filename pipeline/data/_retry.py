"""Retries for the index's own reads (footers, the scan), which Ray Data's retried I/O does not
cover: throttling, 5xx answers and dropped connections are retried with backoff and counted;
any other error is raised at once."""

from __future__ import annotations

import errno
import re
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["ATTEMPTS", "is_transient", "retrying"]

T = TypeVar("T")

ATTEMPTS = 5  # tries in all; backoff BASE_DELAY_S * 2**k between them (0.2 + 0.4 + 0.8 + 1.6 s)
BASE_DELAY_S = 0.2

_TRANSIENT_TEXT = re.compile(
    # Ray Data's own retried_io_errors (AWS Error SLOW_DOWN, ...) plus the generic HTTP/socket forms.
    r"slow[ _]?down|throttl|too many requests|request ?timeout|timed? ?out|"
    r"connection (reset|refused|aborted|closed)|broken pipe|temporar|service[ _]unavailable|"
    r"internal[ _]?(error|failure)|network[ _]connection|\b(429|500|502|503|504)\b",
    re.IGNORECASE,
)
_TRANSIENT_ERRNO = {
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EAGAIN,
    errno.EPIPE,
}


def is_transient(e: BaseException) -> bool:
    """An error a retry can cure: throttling, a 5xx answer, a reset or timed-out connection."""
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNO:
        return True
    return isinstance(e, OSError) and bool(_TRANSIENT_TEXT.search(str(e)))


def retrying(fn: Callable[[], T], counter: list[int], attempts: int = ATTEMPTS) -> T:
    """fn(), tried again after transient errors; each retry adds one to counter[0]."""
    for k in range(attempts):
        try:
            return fn()
        except Exception as e:
            if k == attempts - 1 or not is_transient(e):
                raise
            counter[0] += 1
            time.sleep(BASE_DELAY_S * 2**k)
    raise AssertionError("unreachable")
