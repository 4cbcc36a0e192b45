"""Workdir files that no crash or full disk can leave unreadable: atomic rewrites, and JSON lines read past a torn end."""

from __future__ import annotations

import json
import logging
import os
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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            f.write(content.encode("utf-8") if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a JSON-lines file; a line cut off mid-record (a kill or a full disk) is dropped with a warning."""
    path = Path(path)
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            logging.warning("%s line %d is not a whole JSON record (a write cut off?); dropped: %.60r", path, number, line)
    return records
