"""sweep's training clock: the wall time it stores survives a kill that skips all clean-up, and resumes add up."""

import json
import time

from sweeps import point_run, timer


def test_time_is_stored_while_the_point_runs_and_a_resume_adds_to_it(tmp_path):
    path = tmp_path / point_run.TIMING_FILE
    stored_mid_run = []

    def train():
        time.sleep(0.4)
        stored_mid_run.append(json.loads(path.read_text())["seconds"])  # what a SIGKILL here would leave

    started = time.monotonic()
    timer.timed(path, train, every_s=0.1)
    elapsed = time.monotonic() - started
    total = json.loads(path.read_text())["seconds"]
    assert 0.0 < stored_mid_run[0] <= total <= elapsed
    assert total >= 0.4

    timer.timed(path, lambda: time.sleep(0.1), every_s=10.0)  # a resumed invocation
    assert json.loads(path.read_text())["seconds"] >= total + 0.1
