"""No silent restart, atomic start-up, readers that never write, divergence stopped at a good checkpoint,
validated knobs, one-line file-system errors, SIGTERM within seconds during a dev evaluation.

The fast tests work on tiny states and configs; the end-to-end ones (tiny model, Multi30k) are marked slow.
"""

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from tests.training.test_checkpoints import corrupt_every_data_file, corrupt_largest_file, state
from tiny import train_config as tiny_config, train_flags as tiny_flags

from training import checkpoints, config as config_lib
from training.core import compile_cache, errors
from training.core.metrics import MetricsWriter
from training.evaluation import dev as dev_lib
from training.run import divergence, loop, workdir as workdir_lib

ROOT = Path(__file__).resolve().parents[3]


def tree(folder: Path) -> dict:
    """Every path under `folder` with its size and modification time (what a reader must leave as it was)."""
    return {
        str(p.relative_to(folder)): (p.is_dir(), p.stat().st_size if p.is_file() else 0, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def steps(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


# ---- damaged checkpoints: moved aside by a writer, refused when none is left, never touched by a reader


def test_every_checkpoint_damaged_is_refused_not_restarted_and_kept_aside(tmp_path):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    for step in (1, 2, 3):
        ckpts.save(step, state(step))
    ckpts.close()
    for step in (1, 2, 3):
        corrupt_largest_file(tmp_path / "checkpoints" / str(step), seed=step)
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    with pytest.raises(checkpoints.NoIntactCheckpoint, match=r"every checkpoint .* damaged \(steps 1, 2, 3.*--restart"):
        ckpts.restore_latest(jax.eval_shape(lambda: state(0)))
    assert steps(tmp_path / "checkpoints" / "damaged") == [1, 2, 3]  # kept, not deleted
    ckpts.save(3, state(3))  # the name is free again: a new save is not skipped
    assert ckpts.latest.all_steps() == [3]
    ckpts.close()
    sums = tmp_path / "checkpoints" / "3" / checkpoints.CHECKSUMS / checkpoints.CHECKSUM_FILE
    assert steps(tmp_path / "checkpoints") == [3] and sums.exists()


def test_a_damaged_newest_checkpoint_is_moved_aside_and_its_step_saved_again(tmp_path):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    ckpts.save(1, state(1))
    ckpts.save(2, state(2))
    ckpts.close()
    corrupt_largest_file(tmp_path / "checkpoints" / "2")
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    _, step = ckpts.restore_latest(jax.eval_shape(lambda: state(0)))
    assert step == 1 and steps(tmp_path / "checkpoints" / "damaged") == [2]
    ckpts.save(2, state(2))
    assert ckpts.latest.all_steps() == [1, 2]
    ckpts.close()


def test_a_reader_falls_back_past_damage_and_changes_nothing(tmp_path):
    ckpts = checkpoints.Checkpoints(tmp_path, keep=3)
    ckpts.save(1, state(1))
    ckpts.save(2, state(2))
    ckpts.close()
    corrupt_largest_file(tmp_path / "checkpoints" / "2")
    before = tree(tmp_path)
    reader = checkpoints.Checkpoints(tmp_path, keep=3, read_only=True)
    restored, step, folder = reader.restore_for_eval(jax.eval_shape(lambda: state(0)))
    reader.close()
    assert (step, folder) == (1, tmp_path / "checkpoints")  # no best/: the latest intact one, and it says where
    np.testing.assert_array_equal(restored["w"], state(1)["w"])
    assert tree(tmp_path) == before  # damaged step 2 still there, no best/ created


def test_a_reader_of_a_workdir_without_checkpoints_creates_no_folders(tmp_path):
    reader = checkpoints.Checkpoints(tmp_path, keep=3, read_only=True)
    assert reader.restore_for_eval(jax.eval_shape(lambda: state(0)))[0] is None
    reader.close()
    assert list(tmp_path.iterdir()) == []


# ---- a workdir that holds a run resumes or is refused; start-up leaves nothing that refuses the same command


def write_metrics(workdir: Path, *records):
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_run_whose_checkpoints_were_emptied_is_refused_naming_what_it_holds(tmp_path):
    write_metrics(tmp_path, {"step": 5, "loss": 5.0}, {"step": 10, "loss": 4.0})
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "checkpoints").mkdir()  # rm -rf checkpoints/*: the folder kept
    with pytest.raises(errors.RunRefused, match=r"metrics.jsonl to step 10.*no checkpoint.*--restart.*new --workdir"):
        workdir_lib.check_history(tmp_path)
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "checkpoints" / "damaged" / "10").mkdir(parents=True)  # every checkpoint was set aside
    with pytest.raises(errors.RunRefused, match=r"checkpoints/damaged/"):
        workdir_lib.check_history(tmp_path)


@pytest.mark.parametrize(
    "left",
    [
        ["config.json"],
        ["config.json", "spm.model", "run_info.json"],
        ["config.json", "spm.model", "checkpoints/", "metrics.jsonl"],
    ],
)
def test_what_a_killed_start_leaves_is_not_a_run(tmp_path, left):
    for name in left:  # a kill during start-up, at each point between the first write and the first record
        if name.endswith("/"):
            (tmp_path / name).mkdir()
        else:
            (tmp_path / name).write_text("")
    workdir_lib.check_history(tmp_path)  # no error: the same command starts the run


def test_dropping_metrics_records_says_so(tmp_path, caplog):
    write_metrics(tmp_path, *({"step": s, "loss": 1.0} for s in (5, 10, 15)))
    with caplog.at_level(logging.WARNING):
        writer = MetricsWriter(tmp_path, resume_step=10)
        writer.close()
    assert [r["step"] for r in writer.records] == [5, 10]
    assert any("1 records after step 10 dropped" in r.getMessage() for r in caplog.records)


# ---- divergence


def test_a_loss_far_above_the_running_loss_is_divergence():
    watch = divergence.LossWatch(10.0)
    for loss in (5.7, 5.6, 5.0, 9.0, 4.0):  # noise, even a 2x bump, is not
        assert watch.check(loss) is None
    assert "above config.divergence_factor (10)" in watch.check(397.0)
    assert watch.check(float("nan")) == "loss is nan"
    off = divergence.LossWatch(0.0)
    assert off.check(5.0) is None and off.check(1e6) is None and off.check(float("inf")) == "loss is inf"
    resumed = divergence.LossWatch(10.0, lowest=2.0)  # a resume starts from the lowest logged loss
    assert resumed.check(25.0) is not None


# ---- validation: the field the user set, before the slow set-up


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("optimizer.learning_rate", -1.0, "config.optimizer.learning_rate = -1.0; expected a finite number > 0"),
        ("optimizer.learning_rate", float("inf"), "config.optimizer.learning_rate = inf; expected a finite number > 0"),
        ("optimizer.learning_rate", float("nan"), "config.optimizer.learning_rate = nan; expected a finite number > 0"),
        ("optimizer.warmup_steps", 0, "config.optimizer.warmup_steps = 0; expected an int >= 1"),
        ("data.train_limit", -1, "config.data.train_limit = -1; expected an int >= 0"),
        ("eval.bleu_examples", -1, "config.eval.bleu_examples = -1; expected an int >= 0"),
        ("data.vocab_size", 0, "config.data.vocab_size = 0; expected an int >= 8"),
        ("divergence_factor", 0.5, "config.divergence_factor = 0.5"),
    ],
)
def test_optimizer_and_data_knobs_are_validated_naming_the_field(field, value, message):
    config = tiny_config()
    *section, name = field.split(".")
    (config[section[0]] if section else config)[name] = value
    with pytest.raises(ValueError) as error:
        config_lib.validate(config)
    assert str(error.value).startswith(message)


def test_cosine_accepts_no_warmup_and_max_len_names_its_field():
    config = tiny_config()
    config.optimizer.schedule, config.optimizer.warmup_steps = "cosine", 0
    config_lib.validate(config)
    config.model.max_len = 8
    with pytest.raises(ValueError, match=r"config.model.max_len = 8; expected an int >= 64"):
        config_lib.check_max_len(config)


def test_a_torn_config_json_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"seed": 0, "model": {"d_mo')
    with pytest.raises(ValueError, match=f"{tmp_path / 'config.json'} is not a whole JSON config"):
        config_lib.load_saved(tmp_path / "config.json")


def test_an_unusable_cache_directory_names_the_field(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"config.compilation_cache_dir = .*file/cache.* cannot be used"):
        compile_cache.enable(str(tmp_path / "file" / "cache"))


def test_an_unwritable_workdir_is_refused_before_the_set_up(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"--workdir .*file is a file"):
        loop.train_and_evaluate(tiny_config(), tmp_path / "file")
    with pytest.raises(ValueError, match=r"--workdir .*file is a file"):
        loop.train_and_evaluate(tiny_config(), tmp_path / "file" / "run")
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == tmp_path else real(path, mode))
    with pytest.raises(ValueError, match=f"{tmp_path} is not writable"):
        loop.train_and_evaluate(tiny_config(), tmp_path / "run")  # read-only parent
    assert time.monotonic() - started < 5  # no data, vocabulary or model was set up


def test_os_errors_and_refusals_are_one_line(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py"])

    def denied():
        raise PermissionError(13, "Permission denied", "/some/workdir/config.json")

    with pytest.raises(SystemExit) as exit_:
        errors.run_reporting_user_errors("train.py", denied)
    assert exit_.value.code == "train.py: error: /some/workdir/config.json: Permission denied"

    def diverged():
        raise divergence.NonFiniteLoss("loss is nan at step 3; stopping without saving: no checkpoint has been saved")

    with pytest.raises(SystemExit) as exit_:
        errors.run_reporting_user_errors("train.py", diverged)
    assert exit_.value.code.startswith("train.py: error: loss is nan at step 3") and "\n" not in exit_.value.code


def run_cli(script, *flags, **kwargs):
    return subprocess.run(
        [sys.executable, str(ROOT / script), *flags],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
        **kwargs,
    )


def one_line_error(result) -> str:
    """The error line of a refused command: its last on stderr, after log lines only (no traceback, nothing else)."""
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert ": error: " in lines[-1], result.stderr[-2000:]
    assert all(re.match(r"[IWE]\d{4} ", line) for line in lines[:-1]), result.stderr[-2000:]  # absl's log lines
    return lines[-1]


def test_train_py_names_a_missing_config_file_and_a_file_workdir_in_one_line(tmp_path):
    missing = one_line_error(run_cli("train.py", f"--config={tmp_path / 'nope.py'}", f"--workdir={tmp_path / 'run'}"))
    assert str(tmp_path / "nope.py") in missing
    (tmp_path / "file").write_text("")
    is_file = one_line_error(
        run_cli("train.py", f"--config={ROOT / 'configs/default.py'}", f"--workdir={tmp_path / 'file'}")
    )
    assert "is a file" in is_file and str(tmp_path / "file") in is_file


# ---- SIGTERM during a dev evaluation: stop between batches


def test_a_stop_comes_in_between_evaluation_batches():
    calls = []

    def eval_step(params, batch):
        calls.append(batch)
        return {"nll_sum": 1.0, "tokens": 1.0}

    with pytest.raises(dev_lib.Stopped):
        dev_lib.dev_loss(None, dev_lib.until_stopped(range(5), stop=lambda: len(calls) == 2), eval_step)
    assert len(calls) == 2  # the third batch never ran
    assert dev_lib.dev_loss(None, dev_lib.until_stopped(range(5), None), eval_step) == 1.0


# ---- end to end on a tiny model

slow_multi30k = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="MULTI30K_DIR is not set"),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny run: checkpoints 10 and 20, best/, metrics (copy it before changing it)."""
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set")
    workdir = tmp_path_factory.mktemp("trained") / "run"
    result = run_cli("train.py", *tiny_flags(), f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def copy_of(trained, tmp_path) -> Path:
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    return workdir


@pytest.mark.parametrize("damage", ["every checkpoint", "checkpoints emptied"])
@pytest.mark.slow
def test_a_run_without_an_intact_checkpoint_is_refused_until_restart_which_keeps_it(trained, tmp_path, damage):
    workdir = copy_of(trained, tmp_path)
    if damage == "every checkpoint":
        for step in steps(workdir / "checkpoints"):
            corrupt_every_data_file(workdir / "checkpoints" / str(step), seed=step)
        for step in steps(workdir / "best"):  # best/ too (its checksums off by one): an intact state there is resumed
            sums = workdir / "best" / str(step) / checkpoints.CHECKSUMS / checkpoints.CHECKSUM_FILE
            sums.write_text(json.dumps({name: value + 1 for name, value in json.loads(sums.read_text()).items()}))
    else:
        for child in (workdir / "checkpoints").iterdir():
            shutil.rmtree(child)
    metrics = (workdir / "metrics.jsonl").read_text()
    for _ in range(2):  # refused, and refused again: never a silent restart from step 0
        line = one_line_error(run_cli("train.py", *tiny_flags(), f"--workdir={workdir}"))
        assert "--restart" in line and ("damaged" in line if damage == "every checkpoint" else "no checkpoint" in line)
        assert (workdir / "metrics.jsonl").read_text() == metrics  # the history is not cut
    restarted = run_cli("train.py", *tiny_flags(), f"--workdir={workdir}", "--restart")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    previous = next((workdir / "previous").iterdir())
    assert (previous / "metrics.jsonl").read_text() == metrics and steps(previous / "best")  # moved aside, whole
    assert (
        steps(workdir / "checkpoints") == [10, 20]
        and [json.loads(r)["step"] for r in (workdir / "metrics.jsonl").read_text().splitlines()][0] == 5
    )


@pytest.mark.slow
def test_a_workdir_with_checkpoints_but_no_config_json_is_refused_not_resumed(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    (workdir / "config.json").unlink()
    before = tree(workdir)
    flags = tiny_flags(30, **{"seed": 7, "optimizer.learning_rate": 0.01})
    line = one_line_error(run_cli("train.py", *flags, f"--workdir={workdir}"))
    assert "no config.json" in line and "--restart" in line, line
    assert tree(workdir) == before  # nothing trained, nothing rewritten


@pytest.mark.slow
def test_a_config_json_edited_to_another_model_is_a_mismatch_and_moves_nothing(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    saved = json.loads((workdir / "config.json").read_text())
    saved["model"]["mlp_dim"] = 48  # edited by hand to match the requested config
    (workdir / "config.json").write_text(json.dumps(saved))
    line = one_line_error(run_cli("train.py", *tiny_flags(30, **{"model.mlp_dim": 48}), f"--workdir={workdir}"))
    assert re.search(
        r"checkpoint 20 .* holds \S+ \((\d+, )?32,?\) float32, but the requested config builds \((\d+, )?48,?\)", line
    ), line
    assert not (workdir / "checkpoints" / "damaged").exists() and steps(workdir / "checkpoints") == [10, 20]


@pytest.mark.slow
def test_a_start_killed_after_config_json_is_started_again_by_the_same_command(trained, tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    shutil.copy(trained / "config.json", workdir / "config.json")  # SIGKILL right after config.json was written
    result = run_cli("train.py", *tiny_flags(10), f"--workdir={workdir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert steps(workdir / "checkpoints") == [10]


def eval_py(workdir, *flags):
    return run_cli("eval.py", f"--workdir={workdir}", "--beam_size=1", *flags)


@pytest.mark.slow
def test_eval_reads_a_damaged_workdir_in_use_without_writing_and_says_which_step(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    corrupt_every_data_file(workdir / "checkpoints" / "20")
    shutil.rmtree(workdir / "best")  # so the damaged latest is what it falls back from
    holder = subprocess.Popen(["sleep", "3600"])  # a live train.py holds the workdir until killed below
    try:
        (workdir / workdir_lib.LOCK_FILE).write_text(f"{socket.gethostname()}:{holder.pid}")
        before = tree(workdir)
        hypotheses = tmp_path / "hyps.txt"
        result = eval_py(workdir, "--split=val", f"--hypotheses={hypotheses}")
        assert result.returncode == 0, result.stderr[-3000:]
        assert tree(workdir) == before  # checkpoints/20 (damaged) still there; nothing created
        score = json.loads(result.stdout)
        assert score["step"] == 10 and score["checkpoint"] == str((workdir / "checkpoints" / "10").absolute())
        assert len(hypotheses.read_text().splitlines()) == 1014
        translated = (
            eval_py(workdir, f"--input={tmp_path / 'long.de'}", f"--output={tmp_path / 'long.en'}")
            if (tmp_path / "long.de").write_text("ein Hund\n" + "Hund " * 10000 + "\n")
            else None
        )
        assert translated.returncode == 0 and tree(workdir) == before
        assert "step 10" in translated.stdout
        assert "1 of 2 lines" in translated.stderr and "cut to it: line 2" in translated.stderr  # not silent
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_readers_take_no_compilation_cache_from_the_workdirs_config(trained, tmp_path):
    """A received workdir's config.json named where eval.py created a folder and loaded compiled programs from."""
    workdir = copy_of(trained, tmp_path)
    saved = json.loads((workdir / "config.json").read_text())
    saved["compilation_cache_dir"] = str(tmp_path / "planted")
    (workdir / "config.json").write_text(json.dumps(saved))
    (tmp_path / "in.de").write_text("ein Hund\n")
    translated = eval_py(
        workdir,
        f"--input={tmp_path / 'in.de'}",
        f"--output={tmp_path / 'out.en'}",
        f"--compilation_cache_dir={tmp_path / 'mine'}",
    )
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert not (tmp_path / "planted").exists() and (tmp_path / "mine").is_dir()
    analyzed = run_cli("analyze.py", "maps", f"--workdir={workdir}", "--sentence=ein Hund", "--compilation_cache_dir=")
    assert analyzed.returncode == 0, analyzed.stderr[-3000:]
    assert not (tmp_path / "planted").exists() and (workdir / "analysis" / "maps_sentence_encoder_self.png").exists()


@pytest.mark.slow
def test_eval_refuses_an_unwritable_hypotheses_path_before_scoring(trained, tmp_path):
    started = time.monotonic()
    line = one_line_error(eval_py(trained, "--split=val", f"--hypotheses={tmp_path / 'missing' / 'h.txt'}"))
    assert "cannot be written" in line and str(tmp_path / "missing") in line
    assert time.monotonic() - started < 60  # no checkpoint read, no decoding (the whole split takes longer)


@pytest.mark.slow
def test_a_huge_learning_rate_stops_in_one_line_at_a_checkpoint_with_a_sane_loss(tmp_path):
    workdir = tmp_path / "run"
    flags = tiny_flags(60, **{"optimizer.learning_rate": 300.0, "checkpoint_every_steps": 1, "eval_every_steps": 100})
    line = one_line_error(run_cli("train.py", *flags, f"--workdir={workdir}"))
    assert "above config.divergence_factor (10)" in line, line
    stopped = int(line.split(" at step ")[1].split(";")[0])
    kept = steps(workdir / "checkpoints")
    assert (
        kept
        and max(kept) < stopped - 1
        and f"last good checkpoint is step {max(kept)} in" in line
        and "(its loss was sane)" in line
    )
    assert steps(workdir / "checkpoints" / "diverged") == [stopped - 1]  # the state that gave the bad loss, kept aside
    losses = [
        r["loss"] for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines()) if "split" not in r
    ]
    assert all(loss < 10 * 6 for loss in losses)  # every logged window was sane (ln 300 = 5.7 at the start)


@pytest.mark.slow
def test_a_diverged_run_started_again_stops_again_against_the_recorded_baseline_and_keeps_its_good_checkpoint(tmp_path):
    workdir = tmp_path / "run"
    flags = tiny_flags(
        60,
        **{
            "optimizer.learning_rate": 300.0,
            "checkpoint_every_steps": 1,
            "eval_every_steps": 100,
            "keep_checkpoints": 2,
        },
    )
    first = one_line_error(run_cli("train.py", *flags, f"--workdir={workdir}"))
    baseline = re.search(r"lowest running loss \(([\d.]+)\)", first).group(1)
    kept = int(re.search(r"last good checkpoint is step (\d+)", first).group(1))
    again = one_line_error(run_cli("train.py", *flags, f"--workdir={workdir}"))  # the same command again
    assert f"lowest running loss ({baseline})" in again, (first, again)
    assert kept in steps(workdir / "checkpoints")  # rotation (2 kept) did not delete the good one


@pytest.mark.slow
def test_sigterm_during_a_dev_evaluation_stops_within_seconds_and_the_resume_redoes_it(tmp_path):
    workdir = tmp_path / "run"
    # the whole dev split, greedy, up to 50 extra tokens: far longer than a stop between batches may take
    flags = tiny_flags(
        4,
        **{
            "log_every_steps": 2,
            "eval_every_steps": 2,
            "checkpoint_every_steps": 4,
            "eval.bleu_examples": 0,
            "eval.max_extra_length": 50,
            "compilation_cache_dir": "",  # compiled, not loaded from a warm cache: the evaluation lasts
        },
    )
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *flags, f"--workdir={workdir}"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    for line in process.stderr:
        if "step 2/4" in line:  # logged right before the evaluation at step 2
            break
    time.sleep(2.0)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    rest = process.communicate(timeout=300)[1]
    took = time.monotonic() - signalled
    assert process.returncode == 0, rest[-3000:]
    assert "during the dev evaluation" in rest and took < 15, (took, rest[-2000:])  # one batch, not the evaluation
    assert steps(workdir / "checkpoints") == [2]
    records = [json.loads(r) for r in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in records if "split" in r]
    resumed = run_cli("train.py", *flags, f"--workdir={workdir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    dev_steps = [
        r["step"] for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines()) if "split" in r
    ]
    assert dev_steps == [2, 4]  # the interrupted evaluation was redone


def test_analyze_refuses_an_unwritable_workdir_before_loading(tmp_path, monkeypatch):
    import analyze

    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == tmp_path else real(path, mode))
    with pytest.raises(
        ValueError, match=f"--workdir {tmp_path}: {tmp_path} is not writable; analyze.py writes to WORKDIR/analysis/"
    ):
        analyze.main(["roles", f"--workdir={tmp_path}"])  # an empty folder: loading it would fail differently


@pytest.mark.slow
def test_analyze_writes_only_its_analysis_folder_and_says_which_step(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    # damaged best/: analyze falls back to checkpoints/20, touching neither
    corrupt_every_data_file(workdir / "best" / str(steps(workdir / "best")[0]))
    before = tree(workdir)
    result = run_cli("analyze.py", "roles", f"--workdir={workdir}", "--examples=4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"step 20 ({(workdir / 'checkpoints' / '20').absolute()})" in result.stderr
    after = {k: v for k, v in tree(workdir).items() if not k.startswith("analysis")}
    assert after == before and (workdir / "analysis" / "roles.csv").exists()


def test_a_reader_waits_for_a_best_being_replaced_instead_of_taking_the_latest(tmp_path):
    import threading

    writer = checkpoints.Checkpoints(tmp_path, keep=3)
    writer.save_if_best(1, state(1), dev_loss=2.0)
    writer.save(3, state(3))
    writer.wait()  # on disk before it is damaged
    corrupt_largest_file(tmp_path / "best" / "1")  # read while being replaced: unreadable for a moment
    replace = threading.Timer(0.3, lambda: writer.save_if_best(2, state(2), dev_loss=1.0))
    replace.start()
    reader = checkpoints.Checkpoints(tmp_path, keep=3, read_only=True)
    restored, step, folder = reader.restore_for_eval(jax.eval_shape(lambda: state(0)))
    replace.join()
    reader.close()
    writer.close()
    assert (step, folder) == (2, tmp_path / "best")  # the new best, not checkpoints/3
    np.testing.assert_array_equal(restored["w"], state(2)["w"])
