"""sweep.py end to end on a two-point tiny sweep: runs, skips finished points, collects tables and a plot."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.sweeps import sweep

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
CONFIG = "tests/training/sweeps/tiny_sweep.py"


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    workdir = tmp_path_factory.mktemp("sweep")
    results = workdir / "results"
    out = run_cli("--config", CONFIG, "--workdir", workdir, "--seeds", "1", "--jobs", "2", "--results_dir", results)
    return workdir, results, out


def run_cli(*args):
    done = subprocess.run([sys.executable, "sweep.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_every_point_runs_and_is_measured(swept):
    workdir, _, out = swept
    for name, heads in (("h1_seed0", 1), ("h2_seed0", 2)):
        assert f"[sweep] done {name}" in out
        result = json.loads((workdir / name / "result.json").read_text())
        assert (result["num_heads"], result["head_dim"], result["step"]) == (heads, 16 // heads, 4)
        # Cache bytes from the arrays: 1 decoder layer x (K, V) x d_model 16 x float32, whatever h is.
        assert result["kv_cache_bytes_per_token"] == 1 * 2 * 16 * 4
        assert 0 <= result["dev_bleu"] <= 100 and result["test_perplexity"] > 1
    # One shared vocabulary: the points tokenise identically.
    assert (workdir / "h1_seed0" / "spm.model").read_bytes() == (workdir / "spm.model").read_bytes() == (workdir / "h2_seed0" / "spm.model").read_bytes()


def test_finished_points_are_skipped(swept):
    workdir, results, _ = swept
    stamp = (workdir / "h1_seed0" / "result.json").stat().st_mtime_ns
    out = run_cli("--config", CONFIG, "--workdir", workdir, "--seeds", "1", "--results_dir", results)
    assert "[sweep] start" not in out
    assert (workdir / "h1_seed0" / "result.json").stat().st_mtime_ns == stamp
    assert run_cli("--config", CONFIG, "--workdir", workdir, "--seeds", "1", "--print_commands") == ""


def test_collect_writes_table_csv_and_plot(swept):
    workdir, _, _ = swept
    results = workdir / "collected"
    run_cli("--collect", "--workdir", workdir, "--results_dir", results)
    table = (results / "tiny_heads.md").read_text().splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[:6] == ["h", "d_k", "parameters", "dev PPL", "dev BLEU", "test BLEU"]
    assert [line.split("|")[1].strip() for line in table[2:]] == ["1", "2"]
    assert table[2].split("|")[10].strip() == "24.9"  # the paper's h=1 dev BLEU beside ours
    rows = list(csv.DictReader(open(results / "tiny_heads.csv")))
    assert [r["value"] for r in rows] == ["1", "2"] and "dev_bleu_mean" in rows[0]
    assert (results / "tiny_heads.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_print_commands_lists_unfinished_points(tmp_path):
    out = run_cli("--config", CONFIG, "--workdir", tmp_path, "--seeds", "2", "--print_commands").splitlines()
    assert len(out) == 4 and out[0].endswith("--point h=1 --seed 0") and out[1].endswith("--point h=2 --seed 0")


def test_bad_sweep_config(tmp_path):
    (tmp_path / "plain.py").write_text("def get_config(arg=None):\n    return None\n")
    with pytest.raises(ValueError, match="lacks SWEEP_NAME"):
        sweep.load_module(tmp_path / "plain.py")
    with pytest.raises(FileNotFoundError, match="no such file"):
        sweep.load_module(tmp_path / "missing.py")
    with pytest.raises(ValueError, match="--seeds"):
        sweep.points(sweep.load_module(ROOT / CONFIG), 0)


def test_point_lock_keeps_two_sweeps_apart(tmp_path):
    lock = tmp_path / sweep.LOCK_FILE
    assert sweep.claim(lock) is None  # free: taken
    assert sweep.claim(lock) == lock.read_text()  # held by a live process (this one)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = lock.read_text().split(":")[0]
    lock.write_text(f"{host}:{finished.stdout.strip()}")  # its process has exited: stale
    assert sweep.claim(lock) is None and lock.read_text() == f"{host}:{os.getpid()}"
