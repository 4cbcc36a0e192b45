"""Progress bars for long work (training steps, a sweep's points, a plan's compiles, a split's decode), and the
lines written while one is drawn.

A bar is drawn on stderr only where stderr is a terminal, so logs and CI output stay clean. While a bar is drawn,
the root logger's console handlers (absl's, or a StreamHandler on stdout or stderr) are wrapped so that each log
line is written between the bar's redraws, in the handler's own format; `write` does the same for printed lines.
"""

from __future__ import annotations

import logging
import sys

import tqdm
from absl import logging as absl_logging


def shown() -> bool:
    """Whether bars are drawn here: stderr is a terminal."""
    return sys.stderr.isatty()


class Bar(tqdm.tqdm):
    """A tqdm bar on stderr, disabled unless stderr is a terminal (or as `disable` says); while it is drawn, console
    log lines are written around it (`_AroundBars`)."""

    def __init__(self, iterable=None, *, disable: bool | None = None, **kwargs):
        self._wrapped: list[_AroundBars] = []  # before tqdm's __init__: close() reads it
        super().__init__(iterable, disable=not shown() if disable is None else disable, **kwargs)
        if not self.disable:
            self._wrapped = _wrap_console_handlers()

    def close(self):
        try:
            super().close()
        finally:
            _unwrap(self._wrapped)
            self._wrapped = []


def write(line: str) -> None:
    """Print `line` to stdout (flushed) without breaking a bar drawn on the terminal."""
    tqdm.tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


class _AroundBars(logging.Handler):
    """A console handler whose records are emitted, by the handler itself, with the bars cleared and redrawn after."""

    def __init__(self, inner: logging.Handler):
        super().__init__()  # NOTSET: the inner handler's level decides, in handle()
        self.inner = inner

    def handle(self, record):
        if record.levelno < self.inner.level:
            return False
        with tqdm.tqdm.external_write_mode(file=sys.stderr):
            return self.inner.handle(record)

    def emit(self, record):  # handle() passes every record on; kept for logging.Handler's interface
        self.inner.emit(record)


def _console(handler: logging.Handler) -> bool:
    return isinstance(handler, absl_logging.ABSLHandler) or (
        isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.stderr)
    )


def _wrap_console_handlers() -> list[_AroundBars]:
    """Wrap the root logger's console handlers (one list swapped in: a record being logged sees the old or the new)."""
    root = logging.getLogger()
    before = root.handlers
    wrapped = [_AroundBars(h) for h in before if _console(h)]  # another bar's wrappers stay as they are
    by_inner = {id(w.inner): w for w in wrapped}
    root.handlers = [by_inner.get(id(h), h) for h in before]
    return wrapped


def _unwrap(wrapped: list[_AroundBars]) -> None:
    root = logging.getLogger()
    root.handlers = [h.inner if any(h is w for w in wrapped) else h for h in root.handlers]
