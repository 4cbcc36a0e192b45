"""What a run does when it is started wrongly, twice, or on a damaged workdir (issue 18), on tiny runs."""

import os
import socket
import subprocess

import pytest

from test_loop import tiny_config
from training.data import corpus
from training.run import loop

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def multi30k():
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")


def offline(url, timeout):
    raise corpus.urllib.error.URLError("offline")


@pytest.mark.parametrize("field, value, error", [
    ("data.dir", "nowhere", FileNotFoundError),  # a data dir that does not exist (and cannot be downloaded)
    ("data.token_budget", 4, ValueError),  # caught by the batching
    ("model.attention_impl", "cudnn", ValueError),  # caught when the model is built on the CPU
])
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
    other = subprocess.Popen(["sleep", "60"])  # a live process on this host holds the workdir
    try:
        (workdir / "train.lock").write_text(f"{socket.gethostname()}:{other.pid}")
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
    with pytest.raises(loop.NonFiniteLoss, match=r"dev loss 50000 at step 2 .*last good checkpoint is step 1 in .*checkpoints"):
        loop.train_and_evaluate(config, tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]  # nothing saved after
    assert sorted(p.name for p in (tmp_path / "best").iterdir() if p.name.isdigit()) == ["1"]
