"""User errors at a command line: one line naming the field, value and what is expected, exit status 1, no traceback."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from training.core.lock import DirectoryInUse


class RunRefused(RuntimeError):
    """A run that will not start or go on, for a reason its message gives with what to do (a user decision)."""


# What a user fixes in a flag, a config field, a data file or a workdir; ml_collections reports
# an unknown config field as an AttributeError (or KeyError) carrying its 'Did you mean' hint.
# OSError: a workdir, config or data path that cannot be read or written (its message names the path).
USER_ERRORS = (ValueError, FileNotFoundError, KeyError, AttributeError, DirectoryInUse, RunRefused, OSError)


def run_reporting_user_errors(program: str, run, verbose_flags=("--verbose", "-v", "--v", "--verbosity")) -> None:
    """Call `run()`; a user error exits with one line on stderr (its traceback only with a verbose flag)."""
    try:
        run()
    except USER_ERRORS as error:
        if any(arg.split("=")[0] in verbose_flags for arg in sys.argv[1:]):
            raise
        sys.exit(f"{program}: error: {one_line(error)}")


def one_line(error: BaseException) -> str:
    """The error's message on one line (ml_collections nests its unknown-field KeyError in an AttributeError)."""
    while error.args and isinstance(error.args[0], BaseException):
        error = error.args[0]
    if isinstance(error, OSError) and error.filename is not None:  # e.g. [Errno 13] Permission denied: 'PATH'
        text = f"{error.filename}: {error.strerror or error}"
        if error.filename2 is not None:
            text += f" ({error.filename2})"
        return text
    text = str(error.args[0]) if len(error.args) == 1 else str(error)
    if isinstance(error, KeyError):
        text = f"unknown config field {text}"
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def check_config_path(argv) -> None:
    """Load --config's file and call its get_config once before absl does, so that a missing file, a syntax error or a
    bad argument is one line naming the file (absl's flag parser prints a paragraph with the config's traceback)."""
    for i, arg in enumerate(argv):
        value = (
            arg.split("=", 1)[1]
            if arg.startswith("--config=")
            else argv[i + 1]
            if arg == "--config" and i + 1 < len(argv)
            else None
        )
        if value is None:
            continue
        path, *args = value.split(":", 1)
        if not Path(path).is_file():
            raise FileNotFoundError(f"--config {path}: no such config file")
        try:
            spec = importlib.util.spec_from_file_location("_checked_config", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if not callable(getattr(module, "get_config", None)):
                raise ValueError("defines no get_config(); expected an ml_collections config file")
            module.get_config(*args)
        except SyntaxError as error:
            raise ValueError(
                f"--config {path} line {error.lineno}: {error.msg}; expected a Python config file"
            ) from None
        except Exception as error:  # the config file's own code: reported in one line, its traceback with --verbose
            if any(a.split("=")[0] in ("--verbose", "-v", "--v", "--verbosity") for a in argv):
                raise
            text = one_line(error)
            raise ValueError(
                text if text.startswith(value) else f"--config {value}: {type(error).__name__}: {text}"
            ) from None
