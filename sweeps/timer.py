"""A point's training clock: the wall time a call takes, added to a stored total and saved as it runs (`timed`)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from training.core import files


def timed(path: Path, fn, every_s: float = 30.0) -> None:
    """Run `fn`, adding its wall time to the seconds stored at `path` (so resumed runs add up).

    The total is also rewritten every `every_s` seconds: a process killed with no chance to clean
    up (SIGKILL, a machine restart) loses at most that much of its time, not all of it.
    """
    spent = json.loads(path.read_text())["seconds"] if path.exists() else 0.0
    started = time.monotonic()
    save = lambda: files.write_atomic(path, json.dumps({"seconds": spent + time.monotonic() - started}))
    stop = threading.Event()

    def keep_saving():
        while not stop.wait(every_s):
            save()

    saver = threading.Thread(target=keep_saving, daemon=True)
    saver.start()
    try:
        fn()
    finally:
        stop.set()
        saver.join()
        save()
