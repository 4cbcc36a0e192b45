"""The prefetch thread serves every step's batch in order, ahead of the loop, and stops when told."""

from __future__ import annotations

import threading
import time

import pytest

from training.data.prefetch import Prefetch


def test_batches_come_in_order_and_are_made_ahead():
    made = []
    with Prefetch(lambda step: made.append(step) or step * 10, start=3, stop=20, depth=4) as batches:
        assert batches.get(3) == 30
        time.sleep(0.2)  # the thread fills its queue while the loop "steps"
        assert made[:6] == [3, 4, 5, 6, 7, 8] and len(made) <= 6  # one taken, four queued, one waiting to be put
        assert [batches.get(step) for step in range(4, 20)] == [step * 10 for step in range(4, 20)]
        with pytest.raises(ValueError, match="serves step 20 next, asked for 5"):
            batches.get(5)


def test_an_error_making_a_batch_is_raised_at_its_step():
    def make(step):
        if step == 2:
            raise KeyError("no such batch")
        return step

    with Prefetch(make, start=0, stop=5) as batches:
        assert [batches.get(0), batches.get(1)] == [0, 1]
        with pytest.raises(KeyError, match="no such batch"):
            batches.get(2)


def test_close_stops_a_thread_that_is_ahead():
    batches = Prefetch(lambda step: step, start=0, stop=1_000_000, depth=2)
    batches.get(0)
    batches.close()
    assert not any(t.name == "prefetch" and t.is_alive() for t in threading.enumerate())


def test_the_wait_is_the_time_the_batch_is_not_ready():
    with Prefetch(lambda step: time.sleep(0.05) or step, start=0, stop=3, depth=1) as batches:
        started = time.perf_counter()
        batches.get(0)
        assert time.perf_counter() - started >= 0.04  # the loop waited for a batch being made: data time
