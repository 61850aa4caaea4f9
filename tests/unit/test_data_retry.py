"""Transient storage errors are retried with backoff and counted; anything else is raised at once.

Only type-decided errors here (no message matching, which reads Ray Data's list and so loads
Ray); message patterns are covered in tests/ray/test_feeder_faults.py.
"""

from __future__ import annotations

import pytest

from pipeline.data.retry import RetryPolicy, StorageUnavailableError, is_transient, with_retries


class Flaky:
    """Fails its first `n` calls with `exc`, then returns "ok"; counts calls."""

    def __init__(self, n, exc):
        self.n, self.exc, self.calls = n, exc, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.n:
            raise self.exc
        return "ok"


@pytest.mark.parametrize(
    "exc, transient",
    [
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (TimeoutError("read timed out"), True),
        (BrokenPipeError(), True),
        (FileNotFoundError("s3://b/part-503.parquet: 503 Slow Down"), False),  # never by waiting
        (PermissionError("Access Denied"), False),
        (ValueError("Parquet magic bytes not found"), False),
        (StorageUnavailableError("already retried to the end"), False),
    ],
)
def test_transient_is_decided_by_type_for_connection_timeout_and_permanent_errors(exc, transient):
    assert is_transient(exc) is transient


def test_transient_cause_makes_the_wrapping_error_transient():
    try:
        try:
            raise ConnectionResetError("reset")
        except ConnectionResetError as inner:
            raise RuntimeError("read failed") from inner
    except RuntimeError as e:
        assert is_transient(e)


def test_retries_until_success_and_counts_them():
    fn, waits = Flaky(3, ConnectionResetError("reset")), []
    assert with_retries(fn, what="x", policy=RetryPolicy(attempts=4), sleep=waits.append) == (
        "ok",
        3,
    )
    assert fn.calls == 4 and len(waits) == 3
    assert waits[0] < waits[1] < waits[2]  # exponential backoff (jitter is +-20%)


def test_no_retry_for_a_permanent_error():
    fn = Flaky(1, FileNotFoundError("gone"))
    with pytest.raises(FileNotFoundError):
        with_retries(fn, what="x", sleep=lambda s: None)
    assert fn.calls == 1


def test_exhausted_retries_raise_storage_unavailable_naming_what_and_attempts():
    fn = Flaky(10, TimeoutError("timed out"))
    with pytest.raises(StorageUnavailableError, match=r"s3://b/f: row group 2: 3 attempts") as e:
        with_retries(fn, what="s3://b/f: row group 2", policy=RetryPolicy(attempts=3), sleep=float)
    assert fn.calls == 3 and isinstance(e.value.__cause__, TimeoutError)


def test_backoff_is_capped():
    p = RetryPolicy(backoff_s=1.0, max_backoff_s=4.0)
    assert all(p.delay(i) <= 4.0 * 1.2 for i in range(20))
