"""sweep.py end to end on a two-point tiny sweep, continued on "another machine" through submitit's local executor.

The h = 2 point runs first (local launcher); the whole sweep then continues from a copy of the
committed results alone (a fresh workdir, no checkpoints), where only h = 1 is left, and that
one runs as a submitit job. Two point trainings in all, as many as the sweep has points.
"""

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps import launch, point_run, schema, tables

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CONFIG = "tests/sweeps/tiny_sweep.py"


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    base = tmp_path_factory.mktemp("sweep")
    first = base / "tiny_h2.py"  # the same sweep (same SWEEP_NAME) with only its h = 2 point
    first.write_text((ROOT / CONFIG).read_text().replace("SWEEP_VALUES = (1, 2)", "SWEEP_VALUES = (2,)"))
    workdir, results = base / "machine1" / "runs", base / "machine1" / "results"
    out = run_cli(
        "run", "--config", first, "--workdir", workdir, "--seeds", "1", "--jobs", "2", "--results_dir", results
    )
    # Machine 2: a checkout of the committed results only.
    results2 = base / "machine2" / "results"
    shutil.copytree(results, results2)
    workdir2 = base / "machine2" / "runs"
    module = schema.load_module(ROOT / CONFIG)
    submitted = launch.submit(
        [sys.executable, str(ROOT / "sweep.py")],
        str(ROOT / CONFIG),
        workdir2,
        results2,
        1,
        launch.SlurmOptions(time_min=20),
        cluster="local",
    )
    failed = launch.wait(submitted)
    return {
        "workdir": workdir,
        "results": results,
        "workdir2": workdir2,
        "results2": results2,
        "out": out,
        "submitted": [p.name for p, _ in submitted],
        "failed": failed,
        "sweep": results2 / module.SWEEP_NAME,
    }


def run_cli(*args):
    done = subprocess.run(
        [sys.executable, "sweep.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_every_point_runs_and_is_measured(swept):
    assert "[sweep] done h2_seed0" in swept["out"]
    assert swept["submitted"] == ["h1_seed0"] and swept["failed"] == []  # h2 came from machine 1's results
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    for name, heads in (("h1", 1), ("h2", 2)):
        point = swept["sweep"] / name / "seed0"
        result = json.loads((point / "result.json").read_text())
        assert (result["num_heads"], result["head_dim"], result["step"]) == (heads, 16 // heads, 4)
        # Cache bytes from the arrays: 1 decoder layer x (K, V) x d_model 16 x float32, whatever h is.
        assert result["kv_cache_bytes_per_token"] == 1 * 2 * 16 * 4
        assert 0 <= result["dev_bleu"] <= 100 and result["test_perplexity"] > 1
        assert result["commit"] == head
        assert sorted(p.name for p in point.iterdir()) == [
            "config.json",
            "hypotheses.test_2016_flickr.beam4.txt",
            "hypotheses.val.beam4.txt",
            "metrics.jsonl",
            "result.json",
        ]
        assert len((point / "hypotheses.test_2016_flickr.beam4.txt").read_text().splitlines()) == 1000
    # One shared vocabulary, carried to machine 2 with the results: the points tokenise identically.
    vocabulary = (swept["results"] / "tiny_heads" / "spm.model").read_bytes()
    assert (swept["workdir"] / "h2_seed0" / "spm.model").read_bytes() == vocabulary
    assert (swept["workdir2"] / "h1_seed0" / "spm.model").read_bytes() == vocabulary
    assert not (swept["workdir2"] / "h2_seed0").exists()  # never retrained on machine 2


def test_finished_points_are_skipped(swept):
    results2 = swept["results2"]
    stamp = (swept["sweep"] / "h1" / "seed0" / "result.json").stat().st_mtime_ns
    out = run_cli("run", "--config", CONFIG, "--workdir", swept["workdir2"], "--seeds", "1", "--results_dir", results2)
    assert "[sweep] start" not in out
    assert (swept["sweep"] / "h1" / "seed0" / "result.json").stat().st_mtime_ns == stamp
    assert (
        run_cli(
            "run",
            "--config",
            CONFIG,
            "--workdir",
            swept["workdir2"],
            "--seeds",
            "1",
            "--results_dir",
            results2,
            "--print_commands",
        )
        == ""
    )
    assert (
        launch.submit(
            [sys.executable, str(ROOT / "sweep.py")],
            str(ROOT / CONFIG),
            swept["workdir2"],
            results2,
            1,
            launch.SlurmOptions(),
            cluster="local",
        )
        == []
    )


def test_collect_writes_table_csv_and_plot_from_committed_files_alone(swept, tmp_path):
    results = tmp_path / "checkout" / "results"  # no runs/ anywhere near it
    shutil.copytree(swept["results2"], results, ignore=shutil.ignore_patterns("*.md", "*.csv", "*.png"))
    run_cli("collect", "--results_dir", results)
    text = (results / "tiny_heads.md").read_text()
    assert text.startswith("## Test BLEU against h = 2, over seeds (the primary result)")  # the seed-level table leads
    seed_rows = [line for line in text.splitlines() if line.startswith("| 1 | 1 |")]
    assert seed_rows and "| 4 of 4 |" in seed_rows[0]  # its scored step, of the steps trained
    table = text.split("## Means over seeds\n\n")[1].splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[:7] == ["h", "d_k", "parameters", "dev PPL", "dev BLEU", "test PPL", "test BLEU"]
    assert [line.split("|")[1].strip() for line in table[2:4]] == ["1", "2"]
    assert (
        table[2].split("|")[header.index("paper dev BLEU") + 1].strip() == "24.9"
    )  # the paper's h=1 dev BLEU beside ours
    p_column = (
        header.index("per seed pair: test BLEU p vs h=2's same seed (secondary; two-sided paired randomization)") + 1
    )
    assert 0 < float(table[2].split("|")[p_column]) <= 1 and table[3].split("|")[p_column].strip() == "reference"
    rows = list(csv.DictReader(open(results / "tiny_heads.csv")))
    assert [r["value"] for r in rows] == ["1", "2"] and "dev_bleu_mean" in rows[0]
    assert (results / "tiny_heads.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # where `sweep.py registered` has written the registered analysis, the table leads with it as the primary one
    (results / "tiny_heads_registered.md").write_text("# tiny_heads: the registered analysis\n")
    run_cli("collect", "--results_dir", results)
    text = (results / "tiny_heads.md").read_text()
    assert text.startswith("**The primary analysis of this sweep is the registered one, [tiny_heads_registered.md](")
    assert "## Test BLEU against h = 2, over seeds (secondary: the registered analysis above is primary)" in text
    # a written reading above the marker line survives the next collect; the tables below it are rewritten
    reading = "# tiny_heads: what the runs support\n\nh = 1 reads as written here.\n\n" + tables.READING_END + "\n\n"
    (results / "tiny_heads.md").write_text(reading + "stale tables\n")
    run_cli("collect", "--results_dir", results)
    kept = (results / "tiny_heads.md").read_text()
    assert kept == reading + text


def test_print_commands_lists_unfinished_points(tmp_path):
    out = run_cli(
        "run",
        "--config",
        CONFIG,
        "--workdir",
        tmp_path,
        "--results_dir",
        tmp_path / "results",
        "--seeds",
        "2",
        "--print_commands",
    ).splitlines()
    assert len(out) == 4 and out[0].endswith("--point h=1 --seed 0") and out[1].endswith("--point h=2 --seed 0")


def test_point_lock_keeps_two_sweeps_apart(tmp_path):
    lock = tmp_path / point_run.LOCK_FILE
    assert point_run.claim(lock) is None  # free: taken
    assert f"in use by {socket.gethostname()}:{os.getpid()}" in point_run.claim(
        lock
    )  # held by a live process (this one)
    point_run.release(lock)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(f"{socket.gethostname()}:{finished.stdout.strip()}")  # its process has exited: stale
    assert point_run.claim(lock) is None and json.loads(lock.read_text())["pid"] == os.getpid()


def _vocabulary_point(config, out, barrier, errors):
    barrier.wait()
    try:
        point_run.shared_vocabulary(config, out)
    except Exception as error:
        errors.put(f"{type(error).__name__}: {error}")


@pytest.mark.filterwarnings(
    "ignore::RuntimeWarning", "ignore::DeprecationWarning"
)  # os.fork with JAX imported: the points train no model
def test_points_starting_together_all_get_the_one_shared_vocabulary(tmp_path, monkeypatch):
    import multiprocessing

    from tiny import train_config
    from training.data import tokenizer

    from training import prepared

    words = [f"w{i} x{i % 7} y{i % 5}" for i in range(400)]
    # the shared vocabulary is the prepared-data cache's (training.prepared): trained on these words, in a cache
    # of the test's own
    monkeypatch.setattr(prepared, "corpus_identity", lambda config, limit: {"corpus": "the test's words"})
    monkeypatch.setattr(prepared, "texts", lambda config, limit: iter(words + words))
    monkeypatch.setenv(prepared.ENV, str(tmp_path / "prepared"))
    config = train_config(1)
    config.data.vocab_size = 40
    points, out = 8, tmp_path / "results" / "tiny"
    context = multiprocessing.get_context("fork")
    barrier, errors = context.Barrier(points), context.Queue()
    processes = [context.Process(target=_vocabulary_point, args=(config, out, barrier, errors)) for _ in range(points)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=300)
    assert errors.empty(), errors.get()
    assert [p.exitcode for p in processes] == [0] * points
    assert (out / "spm.model").read_bytes() == tokenizer.train(words + words, 40, seed=0)  # one whole version
    assert sorted(p.name for p in out.iterdir()) == ["spm.model"]
