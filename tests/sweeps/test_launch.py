"""The SLURM options reach submitit's sbatch script; bad options and sweep configs are named errors."""

import io
import os
import sys

import pytest
from submitit.slurm.slurm import _make_sbatch_string

from sweeps import launch
from sweeps.schema import Point


def test_slurm_options_reach_the_sbatch_script(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"  # submitit's SLURM executor wants an srun on PATH; nothing runs it here
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    ex = launch.executor(tmp_path, launch.SlurmOptions(partition="gpu-a100", gpus=2, time_min=90, cpus=8))
    script = _make_sbatch_string(command="true", folder=tmp_path, **ex._executor.parameters)
    for line in (
        "#SBATCH --partition=gpu-a100",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --time=90",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
    ):
        assert line in script


@pytest.mark.parametrize(
    "field, value", [("gpus", -1), ("time_min", 0), ("cpus", 0), ("time_min", 1.5), ("partition", "a b")]
)
def test_bad_slurm_options_are_named(field, value):
    with pytest.raises(ValueError, match=f"--slurm_{field}"):
        launch.SlurmOptions(**{field: value})


def test_unknown_cluster(tmp_path):
    with pytest.raises(ValueError, match="cluster"):
        launch.executor(tmp_path, launch.SlurmOptions(), cluster="pbs")


def test_the_launchers_tally_counts_points_and_spreads_the_rest_over_its_slots():
    now = [0.0]
    tally = launch.Tally(6, 2, clock=lambda: now[0])
    tally.start("a")
    tally.start("b")
    assert tally.postfix() == "done 0, running 2, failed 0, eta ?"  # no point done: no ETA
    now[0] = 10
    tally.finish("a", "done")
    tally.start("c")
    now[0] = 30
    tally.finish("b", "done")  # the points done took 20 s on average
    tally.start("d")
    now[0] = 35
    # c is past the mean (0 s left), d has 15 s left; the 2 queued go on the slot free first: 0 + 20, then 15 + 20
    assert tally.eta_s() == 35
    tally.finish("c", "left")  # stored by another process: counted, not timed
    assert tally.eta_s() == 35  # c's slot is free now, the queued ones as before
    now[0] = 36
    tally.finish("d", "FAILED")  # a failed point's time says nothing of the others'
    assert tally.eta_s() == 20  # the 2 queued, one on each free slot
    assert tally.summary() == "4 of 6 finished: done 2, running 0, failed 1, left 1, eta 00:20"
    tally.start("e")
    tally.start("f")
    now[0] = 46
    assert tally.postfix() == "done 2, running 2, failed 1, left 1, eta 00:10"


class FakeJob:
    """A submitit job as `wait` sees it: its state at each poll (the last one holds), done from poll `ends`."""

    def __init__(self, job_id, polls, states, ends, error=None):
        self.job_id, self.polls, self.states, self.ends, self.error = job_id, polls, states, ends, error

    def done(self):
        return self.polls[0] >= self.ends

    @property
    def state(self):
        return self.states[min(self.polls[0], len(self.states) - 1)]

    def result(self):
        if self.error is not None:
            raise self.error


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_the_slurm_wait_counts_jobs_by_state_as_they_end(monkeypatch, capsys, terminal):
    polls = [0]
    monkeypatch.setattr(launch.time, "sleep", lambda seconds: polls.__setitem__(0, polls[0] + 1))
    jobs = [
        (Point("h", 1, 0), FakeJob("1", polls, ["RUNNING"], 3, RuntimeError())),
        (Point("h", 2, 0), FakeJob("2", polls, ["COMPLETED"], 0)),
        (Point("h", 1, 1), FakeJob("3", polls, ["PENDING", "RUNNING"], 2, RuntimeError("out of memory\nat step 3"))),
    ]
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    failed = launch.wait(jobs)
    assert failed == [Point("h", 1, 0), Point("h", 1, 1)]  # in the order submitted, not the order they failed
    assert capsys.readouterr().out.splitlines() == [
        "[sweep] done h2_seed0 (job 2) [1 of 3 finished]",
        "[sweep] FAILED h1_seed1 (job 3): out of memory [2 of 3 finished]",
        "[sweep] FAILED h1_seed0 (job 1): RuntimeError [3 of 3 finished]",
    ]
    if not terminal:  # a log, CI output: the lines alone
        assert stderr.getvalue() == ""
        return
    drawn = [d.split(", ", 1)[-1].rstrip() for d in stderr.getvalue().split("\r") if "points finished" in d]
    expected = [  # after each poll
        "done 1, running 1, failed 0, pending 1",
        "done 1, running 2, failed 0, pending 0",
        "done 1, running 1, failed 1, pending 0",
        "done 1, running 0, failed 2, pending 0",
    ]
    shown = [d for d in drawn if d in expected]
    assert [d for i, d in enumerate(shown) if i == 0 or d != shown[i - 1]] == expected  # (each redrawn as lines pass)
    assert drawn[-1] == expected[-1] and stderr.getvalue().split("\r")[-1].startswith("[sweep] jobs: 3/3 points")
