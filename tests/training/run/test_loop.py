"""End-to-end: train.py's loop on a Multi30k slice, resume, interruption, failures, eval.py.

The default run keeps one straight run, its SIGTERM-and-resume twin, eval.py and the config checks;
the other variants are marked slow (`pytest -m slow`).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import default
from tiny import train_config as tiny_config  # d_model 16, 1 layer, 300 pairs, 20 steps
from training import checkpoints, config as config_lib
from training.core import compile_cache, precision, step as step_lib
from training.data import corpus
from training.evaluation import evaluate
from training.evaluation.loaded import load_run
from training.run import divergence, loop, window as window_lib

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module", autouse=True)
def multi30k():
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")


def params_of(workdir, step):
    config = tiny_config()
    model = load_run(workdir).model
    abstract = step_lib.abstract_state(model, config)
    ckpts = checkpoints.Checkpoints(workdir, 3)
    ocp = checkpoints.ocp
    state = ckpts.latest.restore(
        step, args=ocp.args.Composite(**{checkpoints.STATE: ocp.args.StandardRestore(abstract)})
    )
    state = state[checkpoints.STATE]
    ckpts.close()
    return state.params


def assert_same_params(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("straight")
    metrics = loop.train_and_evaluate(tiny_config(20), workdir)
    return workdir, metrics


def test_a_run_writes_config_checkpoints_and_metrics(straight_run):
    workdir, metrics = straight_run
    assert json.loads((workdir / "config.json").read_text())["model"]["d_model"] == 16
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["10", "20"]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "split" not in r]
    dev = [r for r in records if r.get("split") == "val"]
    assert [r["step"] for r in train] == [5, 10, 15, 20] and [r["step"] for r in dev] == [10, 20]
    assert all({"loss", "learning_rate", "tokens_per_s", "padding_fraction", "data_fraction"} <= set(r) for r in train)
    assert all({"loss", "perplexity", "bleu"} <= set(r) for r in dev)
    assert all({"compiled", "compile_s", "cache_loaded"} <= set(r) for r in train) and "first_step_s" in train[0]
    assert json.loads((workdir / precision.RUN_INFO).read_text())["model.dtype"]["dtype"] == "float32"
    assert dev[-1]["perplexity"] == pytest.approx(np.exp(dev[-1]["loss"]))
    assert metrics == dev[-1]
    assert list((workdir / "tensorboard").iterdir())
    best_step = min(dev, key=lambda r: r["loss"])["step"]
    assert [p.name for p in (workdir / "best").iterdir() if p.name.isdigit()] == [str(best_step)]
    assert load_run(workdir).step == best_step  # eval.py prefers the best checkpoint


@pytest.mark.slow
def test_stopped_and_resumed_run_ends_with_the_same_parameters(straight_run, tmp_path, monkeypatch):
    first, resumed = tiny_config(10), tiny_config(20)
    first.model.dtype = resumed.model.dtype = "auto"  # resolved float32 here, then bfloat16 where it resumes:
    monkeypatch.setattr(precision, "machine_choice", lambda cache, measure_fn=None, matmul="auto": {"dtype": "float32"})
    loop.train_and_evaluate(first, tmp_path)
    monkeypatch.setattr(
        precision, "machine_choice", lambda cache, measure_fn=None, matmul="auto": {"dtype": "bfloat16"}
    )
    loop.train_and_evaluate(resumed, tmp_path)  # resumes at step 10, in the float32 it started with
    assert_same_params(params_of(tmp_path, 20), params_of(straight_run[0], 20))


def test_sigterm_saves_a_checkpoint_and_the_run_resumes_exactly(straight_run, tmp_path, monkeypatch):
    original = loop.Prefetch.get  # the loop takes step 6's batch as it starts step 6 (made ahead in a thread)

    def batch_then_signal(self, step):
        if step == 6:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, step)

    monkeypatch.setattr(loop.Prefetch, "get", batch_then_signal)
    loop.train_and_evaluate(tiny_config(20), tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["7"]
    monkeypatch.setattr(loop.Prefetch, "get", original)
    loop.train_and_evaluate(tiny_config(20), tmp_path)
    assert_same_params(params_of(tmp_path, 20), params_of(straight_run[0], 20))


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    config = tiny_config(20)
    config.checkpoint_every_steps = 1
    config.optimizer.grad_clip_norm = 0.0
    # finite (validation refuses inf), but past float32's largest: the first update makes the parameters inf
    config.optimizer.learning_rate = 1e39
    with pytest.raises(divergence.NonFiniteLoss, match="not finite after step 1|loss is nan") as stopped:
        loop.train_and_evaluate(config, tmp_path)
    assert "no checkpoint has been saved" in str(stopped.value)  # not a 'last good checkpoint' in an empty folder
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()]


@pytest.mark.slow
def test_time_budget_ends_the_run_with_an_evaluation_and_a_checkpoint(tmp_path):
    config = tiny_config(20)
    config.max_train_seconds = 1e-9
    metrics = loop.train_and_evaluate(config, tmp_path)
    assert metrics["step"] == 1
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()] == ["1"]


@pytest.mark.slow
def test_a_bfloat16_run_tracks_the_float32_run_and_keeps_float32_parameters(straight_run, tmp_path):
    config = tiny_config(20)
    config.model.dtype = "bfloat16"  # on the CPU: the row-major matmuls of backends/xla_cpu_bf16.py
    loop.train_and_evaluate(config, tmp_path)
    train_losses = lambda workdir: [
        r["loss"] for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines()) if "split" not in r
    ]
    np.testing.assert_allclose(train_losses(tmp_path), train_losses(straight_run[0]), rtol=0.02)
    assert {x.dtype for x in jax.tree.leaves(params_of(tmp_path, 20))} == {np.dtype(np.float32)}


@pytest.mark.slow
def test_a_corrupt_latest_checkpoint_is_skipped_and_the_run_redoes_its_steps(straight_run, tmp_path):
    import shutil

    workdir = tmp_path / "run"
    shutil.copytree(straight_run[0], workdir)
    for item in (workdir / "checkpoints" / "20").rglob("*"):
        if item.is_file():
            item.write_bytes(b"garbage")
    loop.train_and_evaluate(tiny_config(20), workdir)  # falls back to step 10, trains 11..20 again
    assert_same_params(params_of(workdir, 20), params_of(straight_run[0], 20))
    steps = [(r["step"], r.get("split")) for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())]
    assert len(steps) == len(set(steps))  # the redone steps replaced their old records


def test_a_workdir_whose_checkpoints_were_deleted_is_refused_not_restarted(straight_run, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(straight_run[0], workdir)
    shutil.rmtree(workdir / "checkpoints")
    metrics = (workdir / "metrics.jsonl").read_text()
    with pytest.raises(FileNotFoundError, match=r"checkpoints.* is missing"):
        loop.train_and_evaluate(tiny_config(20), workdir)
    assert (workdir / "metrics.jsonl").read_text() == metrics  # history kept
    assert not (workdir / "checkpoints").exists() and [p.name for p in (workdir / "best").iterdir() if p.name.isdigit()]


def test_a_workdir_refuses_to_resume_with_another_model(straight_run):
    config = tiny_config(30)
    config.model.d_model = 32
    with pytest.raises(ValueError, match=r"config.model.d_model \(16 there, 32 now\)"):
        loop.train_and_evaluate(config, straight_run[0])


def test_a_workdir_written_before_later_config_fields_still_loads(straight_run, tmp_path):
    # runs/default's config.json predates these fields; eval.py and analyze.py must still load it
    workdir = tmp_path / "old"
    shutil.copytree(straight_run[0], workdir)
    saved = json.loads((workdir / "config.json").read_text())
    for field in ("max_train_seconds", "parallelism", "distributed"):
        del saved[field]
    del saved["mesh"]["shard_embeddings"]
    (workdir / "config.json").write_text(json.dumps(saved))
    loaded = load_run(workdir)
    config, step = loaded.config, loaded.step
    assert step == load_run(straight_run[0]).step
    assert (config.parallelism, config.mesh.shard_embeddings, config.max_train_seconds) == ("jit", False, 0.0)
    assert config.distributed.to_dict() == default.get_config().distributed.to_dict()
    config_lib.validate(config)


@pytest.mark.parametrize(
    "config_arg, flag, named",
    [
        (
            "configs/default.py:h=abc",
            None,
            "configs/default.py:h=abc: h (model.num_heads) = 'abc'; expected a positive int",
        ),
        ("configs/default.py:foo=1", None, "configs/default.py:foo=1: unknown argument 'foo'"),
        ("BROKEN", None, "line 1: invalid syntax; expected a Python config file"),
        ("configs/default.py", "--config.seed=-1", "config.seed = -1; expected an int in [0, 2**32)"),
        ("configs/default.py", "--config.data.bucket_lengths=(64", "config.data.bucket_lengths = ('(64',)"),
    ],
)
def test_a_bad_config_file_argument_or_value_is_one_line(tmp_path, config_arg, flag, named):
    """absl printed the config file's traceback in its flag-parsing error; SentencePiece and the batching their own."""
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config(:\n")
    config_arg = str(broken) if config_arg == "BROKEN" else str(ROOT / config_arg)
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            f"--config={config_arg}",
            *([flag] if flag else []),
            f"--workdir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert (
        out.stderr.strip().startswith("train.py: error: ")
        and named in out.stderr
        and len(out.stderr.strip().splitlines()) == 1
    ), out.stderr
    assert not (tmp_path / "run").exists()


def test_command_line_overrides_and_config_arguments():
    config = default.get_config("h=8,kv=2")
    assert (config.model.num_heads, config.model.num_kv_heads) == (8, 2)
    with pytest.raises(ValueError, match="unknown argument .heads."):
        default.get_config("heads=8")
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "--config",
            str(ROOT / "configs/default.py"),
            "--config.model.no_such_field=1",
            "--workdir",
            "/nonexistent",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode != 0 and "no_such_field" in out.stderr


def test_eval_cli_prints_bleu_and_translates_a_file(straight_run, tmp_path):
    workdir = straight_run[0]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "eval.py"), f"--workdir={workdir}", "--beam_size=2"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["split"] == "val" and 0.0 <= result["bleu"] <= 100.0 and "tok:13a" in result["signature"]
    assert len(Path(result["hypotheses"]).read_text().splitlines()) == 1014

    source = tmp_path / "in.de"
    source.write_text("Ein Hund läuft.\n\nZwei Männer.\n", encoding="utf-8")
    evaluate.translate_file(workdir, source, tmp_path / "out.en", beam_size=1)
    lines = (tmp_path / "out.en").read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # blank line kept, trailing newline
    (tmp_path / "bad.de").write_bytes(b"ok\n\xff\n")
    with pytest.raises(ValueError, match="not UTF-8 \\(line 2"):
        evaluate.translate_file(workdir, tmp_path / "bad.de", tmp_path / "x", beam_size=1)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("model.num_heads", 3, r"config.model.d_model = 256; expected divisible by num_heads \(3\)"),
        ("model.activation", "swish", "config.model.activation = 'swish'"),
        ("model.num_kv_heads", 3, "config.model.num_kv_heads = 3; expected a divisor"),
        ("data.dataset", "imagenet", "config.data.dataset = 'imagenet'"),
        ("data.src", "xx", "config.data.src = 'xx'"),
    ],
)
def test_config_validation_names_the_field(field, value, message):
    config = default.get_config()
    section, name = field.split(".")
    config[section][name] = value
    with pytest.raises(ValueError, match=message):
        config_lib.validate(config)


def test_missing_data_directory_names_the_path(tmp_path, monkeypatch):
    def offline(url, timeout):
        raise corpus.urllib.error.URLError("offline")

    monkeypatch.setattr(corpus.urllib.request, "urlopen", offline)
    config = tiny_config()
    config.data.dir = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/nowhere/train.de.gz is missing"):
        corpus.load_corpus(config, "train")


@pytest.mark.parametrize(
    "norms, logged",
    [
        ([1.0, 2.0, 4.0], 4.0),  # a CPU computes every step's norm: the logged (last) step's is written, not the mean
        ([float("nan"), float("nan"), 4.0], 4.0),  # a GPU or TPU computes the logged step's alone
        ([float("nan"), float("nan")], None),  # a GPU or TPU window cut short by a stop before its logged step
    ],
)
def test_a_log_line_holds_the_logged_steps_gradient_norm_on_every_platform(norms, logged):
    window = window_lib.Window(compile_cache.CompileCounter())
    for i, norm in enumerate(norms):
        metrics = {"loss": 3.0 + i, "nll": 2.0 + i, **({} if np.isnan(norm) else {"grad_norm": norm})}
        window.add(0.1, 0.4, 100, 0.2, metrics)
    line = window.flush(step=len(norms), learning_rate=1e-3)
    assert line.get("grad_norm") == logged
    assert line["loss"] == pytest.approx(3.0 + (len(norms) - 1) / 2)  # the losses are still the window's mean
