"""The run's warning collector, without Ray: each text counted once in order of arrival, with
the processes it came from; a process without a collector prints its warnings as run lines; the
run's warnings go into the W&B summary at the end."""

from __future__ import annotations

import logging
import warnings

import pytest

import pipeline.data.run_warnings as rw
import pipeline.train.loop as loop
from pipeline.data.run_warnings import RUN_PREFIX, WarningCollector, forward_warnings, one_line
from pipeline.learn.logger import ListLogger, SkipLoggedSteps, TeeLogger


def test_the_collector_counts_each_text_once_in_order_with_its_sources():
    c = WarningCollector()
    c.add("row cache file a is corrupt", "feeder")
    c.add("3 retries", "rank 0")
    c.add("3 retries", "rank 1")
    c.add("3 retries", "rank 0")
    assert c.since(0) == [("row cache file a is corrupt", "feeder"), ("3 retries", "rank 0")]
    assert c.since(2) == []
    assert c.summary()[1] == {"text": "3 retries", "count": 3, "sources": ["rank 0", "rank 1"]}


def test_a_warning_becomes_one_line_without_colour_codes():
    assert one_line("\x1b[1mLOAD REPORT\x1b[0m\n  Key | Status\n") == "LOAD REPORT Key | Status"


@pytest.fixture
def fresh_process(monkeypatch):
    """forward_warnings installs itself once per process: give it a process of its own."""
    loggers = [logging.getLogger(n) for n in rw.FORWARDED_LOGGERS]
    saved = [list(lg.handlers) for lg in loggers]
    for lg in loggers:  # an earlier test of this process may have installed its own forwarding
        lg.handlers[:] = [h for h in lg.handlers if not isinstance(h, rw._Forward)]
    monkeypatch.setattr(rw, "_INSTALLED", [])
    monkeypatch.setattr(rw, "_TARGET", rw._Target())
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    yield
    for lg, handlers in zip(loggers, saved, strict=True):
        lg.handlers[:] = handlers


def test_without_a_collector_a_process_prints_its_warnings_as_run_lines(fresh_process, capsys):
    forward_warnings(None, "rank 0")
    forward_warnings(None, "rank 0")  # once per process
    warnings.showwarning("logging offline instead", UserWarning, "/x/pipeline/learn/logger.py", 3)
    logging.getLogger("bucketray.data").warning("data: row cache %s stops filling", "/rows")
    err = capsys.readouterr().err
    assert err.count(f"{RUN_PREFIX} warning: logging offline instead") == 1
    assert err.count(f"{RUN_PREFIX} warning: data: row cache /rows stops filling") == 1
    assert "WARNING bucketray.data: data: row cache /rows stops filling" in err  # its own log


def test_the_runs_warnings_go_into_the_summary_of_rank_0(monkeypatch):
    found = [{"text": "row cache file a is corrupt", "count": 2, "sources": ["feeder"]}]
    monkeypatch.setattr(loop, "warning_counts", lambda name: found if name == "w" else [])
    inner = ListLogger()
    lg = loop.WarningsInSummary(TeeLogger(inner), "w")
    lg.log({"train/loss": 1.0}, step=1)
    lg.finish()
    assert inner.summaries == {"warnings": found, "warnings/count": 1}
    assert inner.records == [(1, {"train/loss": 1.0})]
    other = ListLogger()
    loop.WarningsInSummary(other, None).finish()  # other ranks: no collector asked
    assert other.summaries == {}


def test_a_summary_passes_the_logged_steps_filter(tmp_path):
    inner = ListLogger()
    SkipLoggedSteps(inner, tmp_path / "state.json").summary({"warnings/count": 3})
    assert inner.summaries == {"warnings/count": 3}
