"""Workdir files that no crash or full disk can leave unreadable: atomic rewrites, and JSON lines read past a torn
end."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import tempfile
from pathlib import Path

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once: the mode a plain open() would give a new file


def write_atomic(path: str | Path, content: str | bytes) -> None:
    """Replace `path` with `content` in one step: readers see the old content or the new, never a part.

    The content goes to a temporary file with a name of its own in the target's directory (created
    exclusively, so it never follows a link planted there), is synced, and is renamed over the target:
    any number of processes may write one target at once, and the last rename wins whole.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        if refusal := naming(error, path):
            raise refusal from error
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            f.write(content.encode("utf-8") if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        os.unlink(tmp)
        if refusal := naming(error, path):  # a write() on a full disk names no file
            raise refusal from error
        raise


# The file system refusing a write: a full disk or quota, a read-only mount, no permission.
REFUSALS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def refusal_code(text: str) -> int | None:
    """The errno in a message of tensorstore's (orbax's writer), "... [os_error_code='28']", if it is a refusal."""
    match = re.search(r"os_error_code='?(\d+)", text)
    return int(match.group(1)) if match and int(match.group(1)) in REFUSALS else None


def naming(error: BaseException, path: str | Path) -> OSError | None:
    """The file system's refusal in `error`'s chain (a library such as orbax may wrap it) as an OSError naming `path`
    (what the user frees or makes writable), or None if the chain holds no such refusal."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        code = error.errno if isinstance(error, OSError) else refusal_code(str(error))
        if code in REFUSALS:
            return OSError(code, f"{os.strerror(code)} (writing it)", str(path))
        error = (
            error.__cause__ or error.__context__ or next((a for a in error.args if isinstance(a, BaseException)), None)
        )
    return None


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a metrics JSON-lines file: each line a JSON object with an int `step`.

    A line that is not whole JSON (a write cut off by a kill or a full disk) is dropped with a warning, as is a last
    line that is not UTF-8 (cut inside a character); any other line that is not UTF-8, or JSON that is not such a
    record, is a ValueError naming the file and the line.
    """
    path = Path(path)
    records = []
    lines = path.read_bytes().split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        torn = number == len(lines)  # no newline after it: the write may have been cut off
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            if torn or isinstance(error, json.JSONDecodeError):
                logging.warning(
                    "%s line %d is not a whole JSON record (a write cut off?); dropped: %.60r", path, number, raw
                )
                continue
            raise ValueError(
                f"{path} line {number} is not UTF-8 text ({error}); expected one JSON object a line "
                "(restore the file, or move it aside)"
            ) from None
        if (
            not isinstance(record, dict)
            or not isinstance(record.get("step"), int)
            or isinstance(record.get("step"), bool)
        ):
            got = (
                f"a JSON {type(record).__name__}"
                if not isinstance(record, dict)
                else f"an object without an int 'step' ({raw[:60]!r})"
            )
            raise ValueError(
                f"{path} line {number} holds {got}; expected a metrics record, a JSON object with an int 'step'"
            )
        records.append(record)
    return records
