"""Workdir files that no crash or full disk can leave unreadable: atomic rewrites, and JSON lines read past a torn end."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path


def write_atomic(path: str | Path, content: str | bytes) -> None:
    """Replace `path` with `content` in one step: readers see the old content or the new, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(content.encode("utf-8") if isinstance(content, str) else content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
