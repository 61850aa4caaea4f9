"""Transient storage errors: which ones are worth repeating, and a bounded backoff loop for them.

Throttling, a 5xx or a dropped connection usually passes; a corrupt or missing file does not.
`is_transient` decides by exception type (connection errors, timeouts) and by message, matching
Ray Data's own list (`DataContext.retried_io_errors`, what its readers retry) plus the phrases
pyarrow's filesystems use for the same conditions. `with_retries` repeats a call while it fails
transiently, with capped exponential backoff and jitter, and returns how many retries it took so
the caller can count them; any other error, or the last transient one, is raised unchanged.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "INDEX_POLICY",
    "RetryPolicy",
    "StorageUnavailableError",
    "is_transient",
    "retrying",
    "with_retries",
]

T = TypeVar("T")

# Messages of transient failures beyond Ray's defaults (which name only AWS SDK codes): the HTTP
# statuses of throttling and unavailability as S3, GCS and Azure report them, and socket-level
# resets and timeouts as pyarrow's filesystems word them. A bare "503" is not enough: file names
# such as part-503.parquet appear in messages too.
EXTRA_TRANSIENT_PATTERNS = (
    r"HTTP status (429|5\d\d)",
    r"(status|response) code:? (429|5\d\d)",
    r"\b(429|500|502|503|504) (Too Many Requests|Internal Server Error|Bad Gateway|Slow ?Down|"
    r"Service Unavailable|Gateway Time-?out)",
    r"(?i)slow ?down|service unavailable|too many requests|throttl",
    r"(?i)connection (reset|aborted|refused|closed)|broken pipe|timed out|timeout was reached",
)
# Types that never become readable by waiting, even when their message matches a pattern above.
PERMANENT_TYPES = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class StorageUnavailableError(RuntimeError):
    """Storage kept failing transiently through every retry (an outage, not bad data)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a transient failure is retried.

    The defaults follow Ray Data's file retries (doubling from 1 s, +-20% jitter), capped lower
    so a read gives up after about 90 s: long enough for throttling or a brief outage to pass.
    """

    attempts: int = 8
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def __post_init__(self):
        assert self.attempts >= 1 and self.backoff_s >= 0, self  # our own callers' values

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (0-based)."""
        return min(self.backoff_s * 2**retry, self.max_backoff_s) * random.uniform(0.8, 1.2)


def _patterns() -> tuple[str, ...]:
    try:
        import ray.data

        ray_list = tuple(ray.data.DataContext.get_current().retried_io_errors)
    except ImportError:  # pragma: no cover - Ray is a dependency; kept importable without it
        ray_list = ()
    return ray_list + EXTRA_TRANSIENT_PATTERNS


def _matches(pattern: str, text: str) -> bool:
    """Substring first, then regex: the order Ray Data applies its retried_io_errors in."""
    if pattern in text:
        return True
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return False


def is_transient(exc: BaseException) -> bool:
    """True for errors that may pass on retry: connection and timeout errors, throttling, 5xx."""
    seen = 0
    while exc is not None and seen < 8:  # the error itself, then what it was raised from
        if isinstance(exc, (StorageUnavailableError, *PERMANENT_TYPES)):
            return False  # already retried to the end, or never passes by waiting
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return True
        if isinstance(exc, OSError):
            text = f"{type(exc).__name__}: {exc}"
            if any(_matches(p, text) for p in _patterns()):
                return True
        exc, seen = exc.__cause__, seen + 1
    return False


def retrying(
    fn: Callable[[], T],
    counter: list[int],
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """fn(), repeated while it fails transiently; each retry adds one to counter[0].

    A non-transient error, or the last transient one once `policy.attempts` are spent, is raised
    unchanged, so the caller can name its file.
    """
    policy = policy or RetryPolicy()
    for i in range(policy.attempts):
        try:
            return fn()
        except Exception as e:
            if i + 1 == policy.attempts or not is_transient(e):
                raise
            counter[0] += 1
            sleep(policy.delay(i))
    raise AssertionError("unreachable")  # the loop returns or raises


def with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[T, int]:
    """(fn(), number of retries it took), repeating fn while it fails transiently.

    A non-transient error is raised at once, unchanged. After `policy.attempts` transient
    failures, `StorageUnavailableError` names `what`, the attempts and the last error (chained).
    """
    policy = policy or RetryPolicy()
    counter, t0 = [0], time.monotonic()
    try:
        return retrying(fn, counter, policy, sleep), counter[0]
    except Exception as e:
        if not is_transient(e):
            raise
        raise StorageUnavailableError(
            f"{what}: {policy.attempts} attempts over {time.monotonic() - t0:.0f} s failed "
            f"with transient storage errors, the last {type(e).__name__}: {e}"
        ) from e


# The index's own reads (footers, the length scan) run on the driver before training starts, where
# a user is waiting: five tries over about 3 s, then the file is named.
INDEX_POLICY = RetryPolicy(attempts=5, backoff_s=0.2, max_backoff_s=1.6)
