"""What a run does when it is started wrongly, twice, or on a damaged workdir, on tiny runs."""

import gzip
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiny import train_config as tiny_config, train_flags as tiny_flags
from training.data import corpus
from training.run import divergence, loop

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def multi30k():
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")


def offline(url, timeout):
    raise corpus.urllib.error.URLError("offline")


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("data.dir", "nowhere", FileNotFoundError),  # a data dir that does not exist (and cannot be downloaded)
        ("data.token_budget", 4, ValueError),  # caught by the batching
        ("model.attention_impl", "cudnn", ValueError),  # caught when the model is built on the CPU
    ],
)
def test_a_failed_start_leaves_no_trace(tmp_path, monkeypatch, field, value, error):
    monkeypatch.setattr(corpus.urllib.request, "urlopen", offline)
    config = tiny_config(2)
    section, name = field.split(".")
    config[section][name] = str(tmp_path / value) if field == "data.dir" else value
    workdir = tmp_path / "run"
    with pytest.raises(error):
        loop.train_and_evaluate(config, workdir)
    assert not workdir.exists()
    assert not (tmp_path / "nowhere").exists()


def test_a_failed_start_on_an_existing_workdir_leaves_it_as_it_was(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    config = tiny_config(2)
    config.data.token_budget = 4
    with pytest.raises(ValueError, match="token_budget"):
        loop.train_and_evaluate(config, workdir)
    assert sorted(p.name for p in workdir.iterdir()) == ["notes.txt"]  # no config.json to refuse the corrected command


def test_a_second_run_on_a_workdir_in_use_refuses_naming_the_holder(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    hold = "import sys; from training.core import lock; print(lock.claim(sys.argv[1]), flush=True); sys.stdin.read()"
    other = subprocess.Popen(  # a live process on this host holds the workdir
        [sys.executable, "-c", hold, str(workdir / "train.lock")],
        cwd=Path(__file__).resolve().parents[3],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline() == "None\n"
        with pytest.raises(RuntimeError, match=f"in use by {socket.gethostname()}:{other.pid}"):
            loop.train_and_evaluate(tiny_config(2), workdir)
    finally:
        other.kill()
        other.wait()
    assert sorted(p.name for p in workdir.iterdir()) == ["train.lock"]  # nothing of the first run touched


def test_a_lock_left_by_a_dead_process_is_taken_over_and_released_at_the_end(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (workdir / "train.lock").write_text(f"{socket.gethostname()}:{dead.pid}")
    config = tiny_config(1)
    config.eval.bleu_examples = 1
    loop.train_and_evaluate(config, workdir)
    assert (workdir / "checkpoints" / "1").is_dir() and not (workdir / "train.lock").exists()


def test_a_loss_too_large_for_its_perplexity_stops_the_run_naming_the_last_good_checkpoint(tmp_path, monkeypatch):
    losses = iter([2.0, 5e4])  # a finite blow-up (learning_rate=300 got there): exp(5e4) overflows a float
    monkeypatch.setattr(loop.dev_lib, "dev_loss", lambda params, batches, eval_step: next(losses))
    config = tiny_config(3)
    config.eval_every_steps = config.checkpoint_every_steps = 1
    config.eval.bleu_examples = 1
    with pytest.raises(
        divergence.NonFiniteLoss, match=r"dev loss 50000 at step 2 .*last good checkpoint is step 1 in .*checkpoints"
    ):
        loop.train_and_evaluate(config, tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [
        "1"
    ]  # nothing saved after
    assert sorted(p.name for p in (tmp_path / "best").iterdir() if p.name.isdigit()) == ["1"]


def run_train(*flags):
    root = Path(__file__).resolve().parents[3]
    return subprocess.run(
        [sys.executable, str(root / "train.py"), "--config", str(root / "configs/default.py"), *flags],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=600,
    )


def test_user_errors_print_one_line_naming_the_field_and_exit_non_zero(tmp_path):
    typo = run_train("--config.model.num_head=8", f"--workdir={tmp_path / 'a'}")
    assert typo.returncode != 0 and "num_head" in typo.stderr and 'did you mean "num_heads"' in typo.stderr.lower()
    assert "Traceback" not in typo.stderr and len(typo.stderr.strip().splitlines()) == 1
    bad = run_train("--config.model.activation=swish", f"--workdir={tmp_path / 'b'}")
    assert bad.returncode != 0 and "config.model.activation = 'swish'" in bad.stderr and "Traceback" not in bad.stderr
    verbose = run_train("--config.model.activation=swish", f"--workdir={tmp_path / 'c'}", "--verbose")
    assert verbose.returncode != 0 and "Traceback" in verbose.stderr  # asked for


def test_data_errors_name_the_file(tmp_path):
    for split, lang in (("train", "de"), ("train", "en")):
        (tmp_path / f"{split}.{lang}.gz").write_text("not gzip\n")
    with pytest.raises(ValueError, match=f"{tmp_path}/train.de.gz"):
        corpus.load_multi30k(tmp_path, "train", "de", "en", download=False)
    empty = tiny_config(2)
    empty.data.train_limit = 0
    for lang in ("de", "en"):
        (tmp_path / f"train.{lang}.gz").write_bytes(gzip.compress(b"\n"))
    empty.data.dir = str(tmp_path)
    for lang in ("de", "en"):
        (tmp_path / f"val.{lang}.gz").write_bytes((Path(os.environ["MULTI30K_DIR"]) / f"val.{lang}.gz").read_bytes())
    with pytest.raises(ValueError, match="data.train_split 'train' has no sentence pairs"):
        loop.train_and_evaluate(empty, tmp_path / "run")


def test_a_vocabulary_larger_than_the_corpus_supports_is_refused(tmp_path):
    config = tiny_config(2)
    config.data.vocab_size = 100000
    with pytest.raises(ValueError, match=r"config.data.vocab_size = 100000; expected at most \d+"):
        loop.train_and_evaluate(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_sigterm_during_the_first_compile_exits_within_seconds(tmp_path):
    root = Path(__file__).resolve().parents[3]
    # A first compile that lasts: four layers in the default's dtype, compiled at XLA's usual optimization level
    # (not the suite's -O0) and not loaded from a warm persistent cache: about 6 s on these CPUs.
    flags = tiny_flags(
        5, **{"model.max_len": 128, "model.dtype": "auto", "model.num_layers": 4, "compilation_cache_dir": ""}
    )
    xla_flags = os.environ.get("XLA_FLAGS", "").replace("--xla_backend_optimization_level=0", "").strip()
    process = subprocess.Popen(
        [sys.executable, str(root / "train.py"), f"--workdir={tmp_path}", *flags],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root), "XLA_FLAGS": xla_flags},
    )
    for line in process.stderr:  # the parameter count is logged right before the first step compiles
        if "model parameters" in line:
            break
    time.sleep(1.5)  # into the compile of the first step
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)
    assert time.monotonic() - started < 5.0
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]  # nothing trained, nothing lost
