"""Progress bars (training.core.progress): drawn only where stderr is a terminal, and log lines written around them."""

import io
import logging
import sys

import pytest
from absl import logging as absl_logging

from training.core import progress


class Terminal(io.StringIO):
    """A stderr that says it is a terminal: what a bar is drawn on."""

    def isatty(self):
        return True


@pytest.fixture
def root_handlers():
    """The root logger's handlers and level as they were, restored after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:], root.level = handlers, level


def lines_as_seen(text: str) -> list[str]:
    """What a terminal shows of each line: the text after its last carriage return (a bar's redraws overwrite)."""
    return [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]


def test_a_bar_counts_on_a_terminal_and_nothing_is_drawn_elsewhere(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress.Bar(total=5, desc="work", unit="item") as bar:
        assert not bar.disable  # (a closed bar says disabled)
        bar.update(2)
        bar.update(3)
    assert "work: 100%" in terminal.getvalue() and "5/5" in terminal.getvalue()

    log = io.StringIO()  # not a terminal: a log file, CI output
    monkeypatch.setattr(sys, "stderr", log)
    handlers = logging.getLogger().handlers[:]
    with progress.Bar(range(3), desc="work") as bar:
        assert bar.disable
        assert list(bar) == [0, 1, 2]  # a disabled bar still iterates
        assert logging.getLogger().handlers == handlers  # and leaves the log handlers as they are
    assert log.getvalue() == ""
    with progress.Bar(total=3, disable=True) as bar:  # a caller's own rule wins (e.g. only process 0 draws)
        monkeypatch.setattr(sys, "stderr", terminal)
        assert bar.disable


@pytest.mark.parametrize("kind", ["stream", "absl"])
def test_log_lines_are_written_between_the_bars_redraws_in_their_own_format(monkeypatch, root_handlers, kind):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    if kind == "absl":  # train.py's: app.run puts absl's handler on the root logger
        handler = absl_logging.ABSLHandler(absl_logging.PythonFormatter())
        handler.python_handler.stream = terminal
    else:
        handler = logging.StreamHandler(terminal)
        handler.setFormatter(logging.Formatter("LOG %(levelname)s %(message)s"))
    root_handlers.handlers[:] = [handler]
    root_handlers.setLevel(logging.INFO)
    with progress.Bar(total=4, desc="steps", mininterval=0) as bar:
        bar.update()
        logging.info("step %d of %d", 1, 4)
        bar.update()
        assert logging.getLogger().handlers != [handler]  # wrapped while the bar is drawn
    assert logging.getLogger().handlers == [handler]  # and as it was once the bar is closed
    logging.info("after the bar")
    shown = lines_as_seen(terminal.getvalue())
    logged = [line for line in shown if "step 1 of 4" in line]
    assert len(logged) == 1 and not logged[0].startswith("steps")  # its own line, not glued to the bar's
    if kind == "absl":
        assert logged[0].startswith("I") and logged[0].endswith("] step 1 of 4")  # absl's prefix kept
    else:
        assert logged[0] == "LOG INFO step 1 of 4"
    assert shown[shown.index(logged[0]) + 1].startswith("steps:  50%")  # the bar redrawn after it
    assert any(line.endswith("after the bar") for line in shown)


def test_a_handler_below_its_level_still_filters(monkeypatch, root_handlers):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    handler = logging.StreamHandler(terminal)
    handler.setLevel(logging.WARNING)
    root_handlers.handlers[:] = [handler]
    root_handlers.setLevel(logging.INFO)
    with progress.Bar(total=1, desc="steps"):
        logging.info("quiet")
        logging.warning("loud")
    assert "quiet" not in terminal.getvalue() and "loud" in terminal.getvalue()


def test_a_printed_line_is_written_between_the_bars_redraws(monkeypatch):
    terminal = Terminal()  # stdout and stderr: one terminal
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(sys, "stdout", terminal)
    with progress.Bar(total=2, desc="points", mininterval=0) as bar:
        bar.update()
        progress.write("[sweep] done a")
        bar.update()
    shown = lines_as_seen(terminal.getvalue())
    assert "[sweep] done a" in shown  # its own line, not glued to the bar's
    assert shown[shown.index("[sweep] done a") + 1].startswith("points: 100%")  # the bar drawn again below it
