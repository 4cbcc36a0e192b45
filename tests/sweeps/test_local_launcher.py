"""The local launcher: `--points_per_device K` (K point processes at a time on a CPU; per GPU, one device and
1/K of its memory each), and one persistent compilation cache for every point of a sweep."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps import launch

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests/sweeps/tiny_sweep.py"

# Stands in for `sweep.py point`: records its command line, environment and lifetime, then exits (storing nothing).
FAKE_POINT = """import json, os, pathlib, sys, time
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--workdir") + 1])
name = args[args.index("--point") + 1].replace("=", "") + "_seed" + args[args.index("--seed") + 1]
started = time.time()
time.sleep(1.5)
(out / (name + ".json")).write_text(json.dumps({"args": args, "started": started, "ended": time.time(),
    "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_MEM_FRACTION")}}))
"""


def test_points_per_device_runs_k_points_at_a_time_on_a_cpu_through_one_cache(tmp_path):
    (tmp_path / "point.py").write_text(FAKE_POINT)
    failed = launch.run_sweep(
        [sys.executable, str(tmp_path / "point.py")],
        str(CONFIG),
        tmp_path,
        tmp_path / "results",
        3,
        points_per_device=2,
    )
    assert failed == []
    runs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("h*_seed*.json"))]
    assert len(runs) == 6  # 2 values x 3 seeds
    # at most K = 2 alive at any moment, and 2 at some moment
    events = sorted([(r["started"], 1) for r in runs] + [(r["ended"], -1) for r in runs], key=lambda e: (e[0], e[1]))
    alive, most = 0, 0
    for _, change in events:
        alive += change
        most = max(most, alive)
    assert most == 2
    # on a CPU no device or memory split is set; every point is told the same compilation cache, the one
    # config.compilation_cache_dir 'auto' names in the sweep's process
    assert all(r["env"] == {"CUDA_VISIBLE_DEVICES": None, "XLA_PYTHON_CLIENT_MEM_FRACTION": None} for r in runs)
    caches = {r["args"][r["args"].index("--compilation_cache_dir") + 1] for r in runs}
    assert caches == {str(launch.sweep_cache_dir())}


def test_points_per_device_on_gpus_gives_each_process_one_device_and_a_memory_share():
    slots = launch.slot_environments("gpu", 2, 3)
    assert [s["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0", "1"] * 3  # spread over the devices first
    assert {s["XLA_PYTHON_CLIENT_MEM_FRACTION"] for s in slots} == {"0.317"}  # 0.95 / 3
    # a sweep limited to some devices shares those
    assert [s["CUDA_VISIBLE_DEVICES"] for s in launch.slot_environments("gpu", 2, 1, visible="4,6")] == ["4", "6"]
    assert launch.slot_environments("cpu", 1, 3) == [{}, {}, {}]
    with pytest.raises(ValueError, match="--points_per_device"):
        launch.slot_environments("gpu", 1, 0)
    with pytest.raises(ValueError, match="platform 'tpu'"):
        launch.slot_environments("tpu", 4, 2)


def test_without_jobs_or_points_per_device_a_machine_with_several_gpus_runs_one_point_on_each(tmp_path, monkeypatch):
    # A point process that saw both GPUs would refuse its one-device mesh; the fake point stands in for it, the
    # two GPUs for this machine's devices.
    (tmp_path / "point.py").write_text(FAKE_POINT)
    monkeypatch.setattr(launch, "local_devices", lambda: ("gpu", 2))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    failed = launch.run_sweep([sys.executable, str(tmp_path / "point.py")], str(CONFIG), tmp_path, tmp_path / "r", 2)
    assert failed == []
    runs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("h*_seed*.json"))]
    assert len(runs) == 4 and sorted(r["env"]["CUDA_VISIBLE_DEVICES"] for r in runs) == ["0", "0", "1", "1"]
    assert {r["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] for r in runs} == {"0.950"}
    # files h1_seed0, h1_seed1, h2_seed0, h2_seed1; seed-major: the two points of one seed ran at once, one per GPU
    for first, second in [(0, 2), (1, 3)]:
        assert runs[first]["started"] < runs[second]["ended"] and runs[second]["started"] < runs[first]["ended"]


@pytest.mark.parametrize("platform, hint", [("tpu", "does not split TPU chips"), ("gpu", "")])
def test_a_sweep_whose_points_would_refuse_their_mesh_is_refused_before_any_starts(
    tmp_path, monkeypatch, platform, hint
):
    # Every point process would see the four devices, and each point's mesh is 1 x 1 (--jobs 1 on the GPUs).
    (tmp_path / "point.py").write_text(FAKE_POINT)
    monkeypatch.setattr(launch, "local_devices", lambda: (platform, 4))
    program = [sys.executable, str(tmp_path / "point.py")]
    with pytest.raises(ValueError, match=r"point h=1: each point process here sees 4 " + platform) as refused:
        launch.run_sweep(program, str(CONFIG), tmp_path, tmp_path / "r", 1, jobs=1 if platform == "gpu" else None)
    assert "expected the number of devices, 4" in str(refused.value) and hint in str(refused.value)
    assert not list(tmp_path.glob("h*_seed*.json"))  # no point started


@pytest.mark.parametrize(
    "platform, devices, visible, expected",
    [
        ("cpu", 1, None, [{}]),
        ("gpu", 1, None, [{}]),  # one GPU: every point sees it, one at a time
        ("tpu", 4, None, [{}]),  # TPU chips are not split between processes: one point at a time sees them all
        ("gpu", 3, "2,5,7", [{"CUDA_VISIBLE_DEVICES": d, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.950"} for d in "257"]),
    ],
)
def test_default_slots(platform, devices, visible, expected):
    assert launch.default_slots(platform, devices, visible) == expected


def test_local_devices_are_listed_without_taking_them():
    platform, count = launch.local_devices()
    assert platform in ("cpu", "gpu", "tpu") and count >= 1


def test_a_point_given_the_sweep_cache_resolves_auto_to_it(tmp_path):
    # What run_point does with --compilation_cache_dir: config.compilation_cache_dir stays 'auto' (so config.json
    # names no machine's path) and resolves to the sweep's directory.
    code = (
        "import jax; from pathlib import Path; from training.core import compile_cache; "
        f"jax.config.update('jax_compilation_cache_dir', {str(tmp_path / 'cache')!r}); "
        "print(compile_cache.cache_dir('auto'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.stdout.strip() == str(tmp_path / "cache"), done.stderr


@pytest.mark.slow
def test_two_points_with_the_same_shapes_share_the_sweep_cache(tmp_path):
    # Seeds 0 and 1 of one point build the same programs: through the sweep's one cache, the second compiles
    # (almost) nothing and loads what the first compiled.
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set")
    config = tmp_path / "tiny_one.py"
    config.write_text(CONFIG.read_text().replace("SWEEP_VALUES = (1, 2)", "SWEEP_VALUES = (2,)"))
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache")}  # the sweep's 'auto', fresh
    done = subprocess.run(
        [
            sys.executable,
            "sweep.py",
            "run",
            "--config",
            str(config),
            "--workdir",
            str(tmp_path / "runs"),
            "--results_dir",
            str(tmp_path / "results"),
            "--seeds",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"--compilation_cache_dir {tmp_path / 'cache'}" in done.stdout
    totals = []
    for seed in (0, 1):
        records = [
            json.loads(line)
            for line in (tmp_path / "runs" / f"h2_seed{seed}" / "metrics.jsonl").read_text().splitlines()
        ]
        totals.append({k: sum(r.get(k, 0) for r in records) for k in ("compiled", "cache_loaded")})
    assert totals[0]["compiled"] > 0 and totals[1]["cache_loaded"] > 0
    assert totals[1]["compiled"] < totals[0]["compiled"] / 2, totals


@pytest.mark.parametrize("flag", ["--points_per_device", "--jobs"])
def test_points_per_device_and_jobs_are_for_the_local_launcher(tmp_path, flag):
    done = subprocess.run(
        [sys.executable, "sweep.py", "run", "--config", str(CONFIG), "--workdir", str(tmp_path)]
        + ["--launcher", "slurm", flag, "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and f"{flag} applies to --launcher local only" in done.stderr


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Ticks:
    """A fake clock and sleep: the launcher's one-second polls, counted."""

    def __init__(self):
        self.now = 0

    def sleep(self, seconds):
        self.now += 1


class FakePoint:
    """Stands in for a point's process: h=1 runs one poll, h=2 two; seed 0 is stored (exit 0), seed 1 fails."""

    def __init__(self, ticks, stored, command, **_):
        self.ticks, self.stored = ticks, stored
        self.name = command[command.index("--point") + 1].replace("=", "") + "_seed" + command[-1]
        self.ends = ticks.now + int(self.name[1])
        self.returncode = None

    def poll(self):
        if self.returncode is None and self.ticks.now >= self.ends:
            self.returncode = 1 if self.name.endswith("seed1") else 0
            if self.returncode == 0:
                self.stored.add(self.name)
        return self.returncode


def test_the_launcher_counts_points_done_running_and_failed_in_its_lines_and_its_bar(tmp_path, monkeypatch, capsys):
    ticks, stored = Ticks(), set()
    monkeypatch.setattr(launch, "local_devices", lambda: ("cpu", 1))
    monkeypatch.setattr(launch.store, "is_finished", lambda out, point: point.name in stored)
    monkeypatch.setattr(launch.subprocess, "Popen", lambda command, **kw: FakePoint(ticks, stored, command))
    monkeypatch.setattr(launch.time, "sleep", ticks.sleep)
    tally = launch.Tally
    monkeypatch.setattr(launch, "Tally", lambda total, slots: tally(total, slots, clock=lambda: ticks.now))
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    failed = launch.run_sweep(["sweep"], str(CONFIG), tmp_path, tmp_path / "r", 2, jobs=2)
    assert [p.name for p in failed] == ["h1_seed1", "h2_seed1"]
    lines = [line.split(": ")[0] if "start" in line else line for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        "[sweep] start h1_seed0 (1 of 4)",
        "[sweep] start h2_seed0 (2 of 4)",
        # poll 1: h1_seed0 took 1 s; h2_seed0 has run 1 of those, the 2 queued take 1 s each on the 2 slots
        "[sweep] done h1_seed0 (exit 0) [1 of 4 finished: done 1, running 1, failed 0, eta 00:01]",
        "[sweep] start h1_seed1 (3 of 4)",
        "[sweep] done h2_seed0 (exit 0) [2 of 4 finished: done 2, running 1, failed 0, eta 00:01]",
        "[sweep] FAILED h1_seed1 (exit 1) [3 of 4 finished: done 2, running 0, failed 1, eta 00:01]",
        "[sweep] start h2_seed1 (4 of 4)",
        "[sweep] FAILED h2_seed1 (exit 1) [4 of 4 finished: done 2, running 0, failed 2, eta 00:00]",
    ]
    drawn = terminal.getvalue().split("\r")  # the bar as drawn after each poll
    # poll 3: h2_seed1 has run 1 s of the 1.5 s the points done took on average
    assert any(
        d.startswith("[sweep]: 3/4 points") and d.endswith("done 2, running 1, failed 1, eta 00:00") for d in drawn
    )
    assert (
        drawn[-1].startswith("[sweep]: 4/4 points finished") and "done 2, running 0, failed 2, eta 00:00" in drawn[-1]
    )
