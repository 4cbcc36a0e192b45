"""Batches made ahead of the training loop in a thread, so that the host's work overlaps the device's step."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Prefetch(Generic[T]):
    """`make(step)` for steps `start`, `start + 1`, ... `stop - 1`, made in order by one thread up to `depth` ahead.

    `get(step)` returns the next one (it must be asked for in order) and waits while it is not made yet: the loop
    times that wait as its data time. An error in `make` is raised by the `get` of its step. `close()` stops the
    thread (a loop that leaves early calls it).
    """

    def __init__(self, make: Callable[[int], T], start: int, stop: int, depth: int = 4):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._make, self._next, self._stop = make, start, stop
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start,), name="prefetch", daemon=True)
        self._thread.start()

    def _run(self, start: int) -> None:
        for step in range(start, self._stop):
            try:
                item: object = self._make(step)
            except BaseException as error:  # handed to the loop, which raises it at this step
                item = error
            while not self._closed.is_set():
                try:
                    self._queue.put((step, item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._closed.is_set() or isinstance(item, BaseException):
                return

    def get(self, step: int) -> T:
        if step != self._next:
            raise ValueError(f"prefetch serves step {self._next} next, asked for {step}")
        made, item = self._queue.get()
        self._next += 1
        if isinstance(item, BaseException):
            raise item
        assert made == step
        return item  # type: ignore[return-value]

    def close(self) -> None:
        self._closed.set()
        self._thread.join()

    def __enter__(self) -> Prefetch[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
