"""User errors at a command line: one line naming the field, value and what is expected, exit status 1, no traceback."""

from __future__ import annotations

import sys

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
