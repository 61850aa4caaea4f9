"""Warnings raised off the driver reach its console once each, counted, and the run's summary.

The feeder actor, the index's Ray Data tasks and the training workers warn in their own
processes, whose output Ray keeps in its session logs: a row-cache file found corrupt, a disk
whose reserve stops the cache filling, a retried read, transformers' notes on a model, none of
which the console showed. So each of these processes forwards its warnings (`forward_warnings`:
this project's logged warnings and `warnings.warn` calls, and transformers' logged warnings) to
the run's collector, one small named actor on the driver's node that counts them by text. The
driver prints each text once as it first arrives (`ConsoleRelay`: a `[bucketray] warning:` line),
and at the end the ones that came again, with their count; the training's rank 0 puts them all
into the W&B run's summary (`warning_counts`). A process with no collector to reach (one
started without a run's driver) prints its warnings as run lines itself, as before.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import warnings

__all__ = [
    "RUN_PREFIX",
    "ConsoleRelay",
    "WarningCollector",
    "active_collector",
    "collector_name",
    "forward_warnings",
    "start_collector",
    "warning_counts",
]

RUN_PREFIX = "[bucketray]"  # the lines the driver's console shows (pipeline.train.console)
# Loggers whose warnings are forwarded: this project's (`pipeline.*`, the feeder's `bucketray.*`)
# and transformers' (its model and load notes).
FORWARDED_LOGGERS = ("pipeline", "bucketray", "transformers")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ACTIVE: list[str] = []  # the collector this (driver) process started last, for what it starts


def collector_name(tag: str) -> str:
    """The collector actor's name for a run (`tag`: unique per driver)."""
    return f"bucketray-warnings-{tag}"


def one_line(text: str) -> str:
    """A warning as one console line: colour codes dropped, whitespace collapsed."""
    return " ".join(_ANSI.sub("", str(text)).split())


class WarningCollector:
    """Actor body: every distinct warning text, in order of first arrival, with its count and
    the processes (`source`) it came from."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.counts: dict[str, int] = {}
        self.sources: dict[str, list[str]] = {}

    def add(self, text: str, source: str) -> None:
        if text not in self.counts:
            self.texts.append(text)
            self.counts[text], self.sources[text] = 0, []
        self.counts[text] += 1
        if source not in self.sources[text]:
            self.sources[text].append(source)

    def since(self, first: int) -> list[tuple[str, str]]:
        """(text, first source) of the texts first seen at position `first` or later."""
        return [(t, self.sources[t][0]) for t in self.texts[first:]]

    def summary(self) -> list[dict]:
        return [
            {"text": t, "count": self.counts[t], "sources": self.sources[t]} for t in self.texts
        ]


def start_collector(name: str):
    """On the driver: start the named collector (zero CPUs, on this node, dies with the
    driver); what this process starts next (the feeder, the index tasks) forwards to it."""
    import ray

    from pipeline.data.connect import on_this_node

    handle = (
        ray.remote(num_cpus=0)(WarningCollector)
        .options(name=name, get_if_exists=True, scheduling_strategy=on_this_node())
        .remote()
    )
    _ACTIVE[:] = [name]
    return handle


def active_collector() -> str | None:
    """The collector this process started last (None: none), for the actors and tasks it starts."""
    return _ACTIVE[0] if _ACTIVE else None


def _stopped_collector(name: str) -> None:
    if _ACTIVE == [name]:
        _ACTIVE.clear()


def warning_counts(name: str | None, timeout_s: float = 10.0) -> list[dict]:
    """The collector's warnings ({"text", "count", "sources"}), [] without one."""
    if not name:
        return []
    import ray

    try:
        return ray.get(ray.get_actor(name).summary.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - a summary without warnings beats a failed run
        return []


class ConsoleRelay:
    """On the driver: prints each new warning the collector `name` holds once, every `every_s`
    seconds on a thread, then (`close`) the last ones and how often the repeated ones came."""

    def __init__(self, name: str, every_s: float = 1.0, out=None):
        self.name, self.every_s, self.out = name, every_s, out
        self.shown = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bucketray-warnings", daemon=True)

    def __enter__(self) -> ConsoleRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _print(self, line: str) -> None:
        print(f"{RUN_PREFIX} {line}", file=self.out or sys.stdout, flush=True)

    def _show_new(self) -> None:
        import ray

        try:
            new = ray.get(ray.get_actor(self.name).since.remote(self.shown), timeout=10)
        except Exception:  # noqa: BLE001 - gone or busy: asked again next time
            return
        for text, source in new:
            self._print(f"warning ({source}): {text}")
        self.shown += len(new)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._show_new()

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        self._show_new()
        for w in warning_counts(self.name):
            if w["count"] > 1:
                self._print(f"warning repeated {w['count']} times: {w['text']}")
        _stopped_collector(self.name)


class _Forward(logging.Handler):
    """Sends each warning record to the collector; `echo` also writes it to this process's
    stderr (its log), which the logger's own handlers would have done without this one."""

    def __init__(self, echo: bool):
        super().__init__(logging.WARNING)
        self.echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                e = record.exc_info[1]
                text = f"{text} ({type(e).__name__}: {e})"
        except Exception:  # noqa: BLE001 - a bad format string must not fail the caller
            return
        if self.echo:
            sys.stderr.write(f"{record.levelname} {record.name}: {text}\n")
        _TARGET.send(one_line(text))


class _Target:
    """Where this process forwards to: the collector's name, its handle once looked up."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.source = "worker"
        self.handle = None

    def send(self, text: str) -> None:
        if self.handle is None and self.name:
            import ray

            try:
                self.handle = ray.get_actor(self.name)
            except Exception:  # noqa: BLE001 - no collector: the line below instead
                self.name = None
        if self.handle is None:
            print(f"{RUN_PREFIX} warning: {text}", file=sys.stderr, flush=True)
            return
        self.handle.add.remote(text, self.source)


_TARGET = _Target()
_INSTALLED: list[bool] = []


def _show_warning(default):
    def show(message, category, filename, lineno, file=None, line=None):
        if "/pipeline/" in str(filename).replace("\\", "/"):
            _TARGET.send(one_line(message))
        else:
            default(message, category, filename, lineno, file, line)

    return show


def forward_warnings(name: str | None, source: str) -> None:
    """In a process off the driver: forward its warnings to the collector `name` (None: print
    them as run lines), naming this process `source` ("feeder", "rank 0", ...). Idempotent; a
    later call (a reused Ray worker process) points the forwarding at its own run."""
    if _TARGET.name != name:
        _TARGET.handle = None
    _TARGET.name, _TARGET.source = name, source
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    for logger_name in FORWARDED_LOGGERS:
        logger = logging.getLogger(logger_name)
        # transformers writes its records to stderr itself; ours went to Python's last resort
        logger.addHandler(_Forward(echo=logger_name != "transformers"))
    warnings.showwarning = _show_warning(warnings.showwarning)
