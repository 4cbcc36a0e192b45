"""Sweep configs and flags: bad ones are ValueErrors naming the field; the Table 3 sweeps share one preset."""

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import (
    ablation_dk,
    ablation_family,
    ablation_family_long,
    ablation_head_size,
    ablation_heads,
    ablation_heads_budget,
    ablation_kv,
    head_size_blocked,
)
from training import config as config_lib
from sweeps import adopt, launch, point_run, schema, store

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests/sweeps/tiny_sweep.py"
GOOD = (
    'SWEEP_NAME = "s"\nSWEEP_KEY = "h"\nSWEEP_VALUES = (1, 2)\nSWEEP_REFERENCE = 2\nSWEEP_TEST_SPLIT = None\n'
    "def get_config(arg=None):\n    return None\n"
)


def test_bad_sweep_config(tmp_path):
    (tmp_path / "plain.py").write_text("def get_config(arg=None):\n    return None\n")
    with pytest.raises(ValueError, match="lacks SWEEP_NAME"):
        schema.load_module(tmp_path / "plain.py")
    with pytest.raises(FileNotFoundError, match="no such file"):
        schema.load_module(tmp_path / "missing.py")
    with pytest.raises(ValueError, match="--seeds"):
        schema.points(schema.load_module(CONFIG), 0)


@pytest.mark.parametrize(
    "line, field",
    [
        ('SWEEP_NAME = "a/b"', "SWEEP_NAME"),
        ('SWEEP_KEY = "h=1"', "SWEEP_KEY"),
        ("SWEEP_VALUES = ()", "SWEEP_VALUES"),
        ("SWEEP_VALUES = (1, 1)", "SWEEP_VALUES"),
        ("SWEEP_VALUES = (0, 2)", "SWEEP_VALUES"),
        ('SWEEP_VALUES = ("1", 2)', "SWEEP_VALUES"),
        ("SWEEP_REFERENCE = 8", "SWEEP_REFERENCE"),
        ("SWEEP_TEST_SPLIT = 3", "SWEEP_TEST_SPLIT"),
        ('SWEEP_SHARED_REFERENCE = "heads"', "SWEEP_SHARED_REFERENCE"),
        ('SWEEP_SHARED_REFERENCE = ("s", 2)', "SWEEP_SHARED_REFERENCE"),
        ('SWEEP_SHARED_REFERENCE = ("heads", 0)', "SWEEP_SHARED_REFERENCE"),
        ('SWEEP_VALUES = ("lsh", 2)', "SWEEP_VALUES"),
        ('SWEEP_VALUES = ("Big Bird", "lsh")', "SWEEP_VALUES"),
        ('SWEEP_VALUES = ("lsh", "mla")', "SWEEP_REFERENCE"),
        ('SWEEP_SHARED = {3: ("heads", 8)}', "SWEEP_SHARED"),
        ('SWEEP_SHARED = {1: ("s", 1)}', "SWEEP_SHARED"),
        ('SWEEP_SHARED = [(1, ("heads", 1))]', "SWEEP_SHARED"),
        ('SWEEP_SHARED_REFERENCE = ("heads", 8)\nSWEEP_SHARED = {2: ("heads", 4)}', "SWEEP_SHARED"),
        ('SWEEP_CONTRASTS = (("x", 1, 3),)', "SWEEP_CONTRASTS"),
        ('SWEEP_CONTRASTS = (("x", 1, 1),)', "SWEEP_CONTRASTS"),
        ('SWEEP_CONTRASTS = ("x", 1, 2)', "SWEEP_CONTRASTS"),
        ('SWEEP_PREREGISTRATION = "results/preregistration.md"', "SWEEP_PREREGISTRATION"),  # no contrasts
        ('SWEEP_CONTRASTS = (("x", 1, 2),)\nSWEEP_PREREGISTRATION = True', "SWEEP_PREREGISTRATION"),
    ],
)
def test_bad_sweep_fields_are_named(tmp_path, line, field):
    path = tmp_path / "bad.py"
    path.write_text(GOOD + line + "\n")
    with pytest.raises(ValueError, match=field):
        schema.load_module(path)


def test_bad_point_is_named():
    module = schema.load_module(CONFIG)
    assert schema.parse_point("h=2", 1, module) == schema.Point("h", 2, 1)
    for arg in ("kv=2", "h=3", "h=x"):
        with pytest.raises(ValueError, match="--point"):
            schema.parse_point(arg, 0, module)
    with pytest.raises(ValueError, match="--seed"):
        schema.parse_point("h=2", -1, module)
    family = schema.load_module(ROOT / "configs/ablation_family.py")  # a sweep over names
    point = schema.parse_point("attention=lsh", 1, family)
    assert point == schema.Point("attention", "lsh", 1) and point.name == "attention_lsh_seed1"
    assert store.point_dir(Path("r"), point) == Path("r/attention_lsh/seed1")
    for arg in ("attention=flash", "attention=1", "h=8"):
        with pytest.raises(ValueError, match="--point"):
            schema.parse_point(arg, 0, family)
    with pytest.raises(ValueError, match="--jobs"):
        launch.run_sweep(["true"], str(CONFIG), Path("/nonexistent"), Path("/nonexistent"), 1, jobs=0)
    with pytest.raises(ValueError, match="--points_per_device"):
        launch.run_sweep(
            ["true"], str(CONFIG), Path("/nonexistent"), Path("/nonexistent"), 1, jobs=2, points_per_device=2
        )


def test_slurm_flags_need_the_slurm_launcher(tmp_path):
    done = subprocess.run(
        [sys.executable, "sweep.py", "run", "--config", str(CONFIG), "--workdir", str(tmp_path), "--slurm_gpus", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and "--slurm_gpus applies to --launcher slurm only" in done.stderr


def test_restart_needs_one_point(tmp_path):
    done = subprocess.run(
        [sys.executable, "sweep.py", "run", "--config", str(CONFIG), "--workdir", str(tmp_path), "--restart"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and "--restart applies to one point: give --point KEY=VALUE and --seed K" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("restart", [False, True])
def test_a_restarted_point_moves_its_run_aside_and_trains_on_the_shared_vocabulary(tmp_path, monkeypatch, restart):
    # A point killed before its first checkpoint: the training refuses to resume it
    # (tests/training/run/test_nothing_lost.py), so `sweep.py point ... --restart` must start it over, on the
    # sweep's one vocabulary, not a vocabulary of its own.
    module = schema.load_module(CONFIG)
    point = schema.parse_point("h=2", 0, module)
    out = schema.sweep_dir(tmp_path / "results", module)
    out.mkdir(parents=True)
    (out / store.VOCABULARY_FILE).write_bytes(b"the sweep's vocabulary")
    run_dir = tmp_path / "runs" / point.name
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 2, "loss": 4.0}) + "\n")  # of the tiny sweep's 4
    (run_dir / "spm.model").write_bytes(b"the killed run's vocabulary")
    seen = {}

    def train(config, workdir, **kwargs):  # what the training would start from
        seen.update(
            kwargs=kwargs,
            files=sorted(p.name for p in Path(workdir).iterdir()),
            vocabulary=(Path(workdir) / "spm.model").read_bytes(),
        )
        with open(Path(workdir) / "metrics.jsonl", "a") as f:  # and then stopped again, at step 3
            f.write(json.dumps({"step": 3, "loss": 3.0}) + "\n")

    monkeypatch.setattr(point_run.loop, "train_and_evaluate", train)
    assert (
        point_run.run_point(str(CONFIG), tmp_path / "runs", point, tmp_path / "results", restart=restart) is None
    )  # stopped early
    assert seen["kwargs"] == {}  # never the training's own restart
    assert not (run_dir / point_run.LOCK_FILE).exists()
    if not restart:
        assert seen["files"] == ["checkpoints", "metrics.jsonl", point_run.LOCK_FILE, "spm.model"]
        assert seen["vocabulary"] == b"the killed run's vocabulary"
        return
    assert seen["files"] == ["previous", point_run.LOCK_FILE, "spm.model"]
    assert seen["vocabulary"] == b"the sweep's vocabulary"
    (aside,) = (run_dir / "previous").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoints", "metrics.jsonl", "spm.model"]
    assert (aside / "spm.model").read_bytes() == b"the killed run's vocabulary"


def field_of(config, dotted):
    return functools.reduce(getattr, dotted.split("."), config)


def test_table3_sweeps_share_one_preset():
    configs = [ablation_heads.get_config("h=2"), ablation_kv.get_config("kv=1"), ablation_dk.get_config("dk=8")]
    for config in configs[1:]:
        for field in (
            "num_train_steps",
            "optimizer.warmup_steps",
            "optimizer.learning_rate",
            "model.d_model",
            "model.num_layers",
            "model.mlp_dim",
            "data.vocab_size",
            "data.token_budget",
            "seed",
        ):
            assert field_of(config, field) == field_of(configs[0], field), field


def test_dk_sweep_fixes_d_v():
    # d_model 256 at h = 8: d_v = 32, d_k in {8, 16, 32}.
    assert ablation_dk.SWEEP_VALUES == (8, 16, 32) and ablation_dk.SWEEP_REFERENCE == 32
    for dk in (8, 16, 32):
        model = ablation_dk.get_config(f"dk={dk}").model
        assert (model.num_heads, model.head_dim, model.v_head_dim) == (8, dk, 32)
    for arg in ("h=8", "dk=0", "dk=x"):
        with pytest.raises(ValueError, match="dk="):
            ablation_dk.get_config(arg)
    schema.load_module(ROOT / "configs/ablation_dk.py")  # a valid sweep config


# every family member's model at translation lengths (~12 s): kept out of the default suite's time budget
@pytest.mark.slow
def test_family_sweep_members_differ_from_softmax_at_translation_lengths():
    # The family sweep's options are sized so that each approximation bites on a ~20-token sentence (with the
    # papers' 64-token blocks, bigbird equals softmax there): every member the sweep sets options
    # for, same init key, either has parameters of its own or computes other outputs than softmax from the same
    # ones. (Every member's model and config path: tests/models/test_transformer_family.py, test_attention_types.py.)
    assert ablation_family.SWEEP_VALUES[0] == ablation_family.SWEEP_REFERENCE == "softmax"
    assert set(ablation_family.OPTIONS) == set(ablation_family.SWEEP_VALUES)
    src = jnp.asarray(np.random.default_rng(0).integers(3, 64, size=(2, 24)), jnp.int32)
    tgt = jnp.asarray(np.random.default_rng(1).integers(3, 64, size=(2, 20)), jnp.int32)
    outputs = {}
    for name in [n for n in ablation_family.SWEEP_VALUES if n == "softmax" or ablation_family.OPTIONS[n]]:
        config = ablation_family.get_config(f"attention={name}")
        config.model.update(
            d_model=64, mlp_dim=64, num_layers=1
        )  # small and quick; h = 8 and the member's options as swept
        config_lib.validate(config)
        model = config_lib.build_model(config, Vocab(), "float32")
        params = model.init(jax.random.key(0), src, tgt)
        outputs[name] = (params, model.apply(params, src, tgt))
        assert np.isfinite(np.asarray(outputs[name][1])).all(), name
    softmax_params, softmax_out = outputs.pop("softmax")
    for name, (params, out) in outputs.items():
        same_params = jax.tree.structure(params) == jax.tree.structure(softmax_params)
        assert not same_params or not np.allclose(out, softmax_out, atol=1e-4), name
    with pytest.raises(ValueError, match="attention=<one of"):
        ablation_family.get_config("attention=flash")


def test_long_family_sweep_changes_only_the_step_count():
    # Its points must be the family sweep's points trained longer, nothing else: compare every field.
    schema.load_module(ROOT / "configs/ablation_family_long.py")  # a valid sweep config
    steps = {"num_train_steps": 6000, "eval_every_steps": 600, "checkpoint_every_steps": 600}
    for name in ablation_family_long.SWEEP_VALUES:
        long = ablation_family_long.get_config(f"attention={name}").to_dict()
        short = ablation_family.get_config(f"attention={name}").to_dict()
        assert {k: long[k] for k in steps} == steps, name
        assert {**long, **{k: short[k] for k in steps}} == short, name
    with pytest.raises(ValueError, match="attention=<one of"):
        ablation_family_long.get_config("attention=bigbird")  # not one of its members


@pytest.mark.slow
def test_a_point_stopped_before_its_last_step_is_not_stored(tmp_path):
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    config = tmp_path / "stopped_sweep.py"  # the tiny sweep, with a time budget that ends training after its first step
    config.write_text(
        CONFIG.read_text().replace("    return config\n", "    config.max_train_seconds = 1e-6\n    return config\n")
    )
    module = schema.load_module(config)
    point = schema.parse_point("h=2", 0, module)
    assert point_run.run_point(str(config), tmp_path / "runs", point, tmp_path / "results") is None
    assert not store.is_finished(schema.sweep_dir(tmp_path / "results", module), point)
    assert (tmp_path / "runs" / "h2_seed0" / "checkpoints").is_dir()  # a later start resumes from here


def flat(config):
    def walk(d, prefix=""):
        for k, v in d.items():
            yield from walk(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, v)]

    return dict(walk(config.to_dict()))


class Vocab:
    def vocab_size(self):
        return 64


@pytest.mark.parametrize(
    "module, arg, spelled, rows_a",
    [
        (ablation_dk, "dk=32", {"model.head_dim": 32, "model.v_head_dim": 32}, 8),
        (ablation_kv, "kv=8", {"model.num_kv_heads": 8}, 8),
        (ablation_family, "attention=softmax", {}, 8),
        (ablation_head_size, "shape=h8_dk32", {"model.head_dim": 32, "model.v_head_dim": 32}, 8),
        (ablation_head_size, "shape=h32_dk8", {"model.head_dim": 8, "model.v_head_dim": 8}, 32),
        (ablation_heads_budget, "run=h8_4000", {}, 8),
        (ablation_heads_budget, "run=h32_4000", {}, 32),
    ],
)
def test_shared_reference_is_the_same_run_as_rows_a_h8(module, arg, spelled, rows_a):
    # The seeds these sweeps copy from rows A (SWEEP_SHARED_REFERENCE, SWEEP_SHARED) must be the run they would train:
    # the configs differ only in spelling out rows A's defaults, and build a model with the same parameters and outputs.
    value = arg.partition("=")[2]
    value = int(value) if value.isdigit() else value
    assert schema.shared_points(module)[value] == (ablation_heads.SWEEP_NAME, rows_a)
    if rows_a == ablation_heads.SWEEP_REFERENCE:
        assert f"{module.SWEEP_KEY}={module.SWEEP_REFERENCE}" == arg
    ours, heads = module.get_config(arg), ablation_heads.get_config(f"h={rows_a}")
    differing = {k: v for k, v in flat(ours).items() if flat(heads)[k] != v}
    assert differing == spelled and all(flat(heads)[k] is None for k in spelled)
    src, tgt = jnp.arange(1, 13).reshape(2, 6) % 64, jnp.arange(3, 15).reshape(2, 6) % 64
    outputs = []
    for config in (ours, heads):
        model = config_lib.build_model(config, Vocab(), "float32")
        params = model.init(jax.random.key(3), src, tgt)
        outputs.append((params, model.apply(params, src, tgt)))
    (p1, y1), (p2, y2) = outputs
    assert jax.tree.structure(p1) == jax.tree.structure(p2)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)))
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y2))


def write_finished(sweep_dir, key, value, seed, test_bleu):
    point = store.point_path(sweep_dir, key, value, seed)
    point.mkdir(parents=True)
    for name in ("metrics.jsonl", "config.json", "hypotheses.val.beam4.txt"):
        (point / name).write_text(f"{name} of {key}{value} seed {seed}\n")
    (point / "result.json").write_text(
        json.dumps({"point": f"{key}={value}", "value": value, "seed": seed, "test_bleu": test_bleu})
    )


def test_shared_reference_seeds_are_copied_not_trained(tmp_path):
    results = tmp_path / "results"
    store.write_spec(results / "heads", {"key": "h"})
    (results / "heads" / "spm.model").write_bytes(b"vocabulary")
    write_finished(results / "heads", "h", 8, 0, 40.0)
    write_finished(results / "heads", "h", 4, 1, 39.0)  # not the shared value
    config = tmp_path / "kv_like.py"
    config.write_text(
        GOOD.replace('"s"', '"kv_like"').replace('"h"', '"kv"') + 'SWEEP_SHARED_REFERENCE = ("heads", 8)\n'
    )
    module = schema.load_module(config)
    todo = launch.pending(results, str(config), module, seeds=2)
    assert [p.name for p in todo] == ["kv1_seed0", "kv1_seed1", "kv2_seed1"]  # kv2 seed 0 came from heads' h8 seed 0
    stored = store.point_path(results / "kv_like", "kv", 2, 0)
    result = json.loads((stored / "result.json").read_text())
    assert result == {"point": "kv=2", "value": 2, "seed": 0, "test_bleu": 40.0, "shared_from": "heads/h8/seed0"}
    assert (stored / "hypotheses.val.beam4.txt").read_text() == "hypotheses.val.beam4.txt of h8 seed 0\n"
    assert (results / "kv_like" / "spm.model").read_bytes() == b"vocabulary"  # adopted, so the points tokenise alike
    # Another vocabulary: a different run, so nothing is shared.
    other = tmp_path / "other"
    store.write_spec(other / "heads", {"key": "h"})
    (other / "heads" / "spm.model").write_bytes(b"vocabulary")
    write_finished(other / "heads", "h", 8, 0, 40.0)
    (other / "kv_like").mkdir()
    (other / "kv_like" / "spm.model").write_bytes(b"another vocabulary")
    assert len(launch.pending(other, str(config), module, seeds=1)) == 2


def test_shared_points_beyond_the_reference_are_copied(tmp_path):
    # The head-size sweep's way: two values that are rows A runs, the reference and another.
    results = tmp_path / "results"
    store.write_spec(results / "heads", {"key": "h"})
    (results / "heads" / "spm.model").write_bytes(b"vocabulary")
    for h, seed in ((8, 0), (8, 1), (4, 0)):
        write_finished(results / "heads", "h", h, seed, 40.0 - seed - (8 - h))
    config = tmp_path / "size_like.py"
    config.write_text(
        GOOD.replace('"s"', '"size_like"')
        .replace('"h"', '"shape"')
        .replace("(1, 2)", '("big", "small", "new")')
        .replace("= 2\n", '= "big"\n')
        + 'SWEEP_SHARED = {"big": ("heads", 8), "small": ("heads", 4)}\n'
        + 'SWEEP_CONTRASTS = (("shrink", "big", "small"),)\n'
    )
    module = schema.load_module(config)
    assert schema.shared_points(module) == {"big": ("heads", 8), "small": ("heads", 4)}
    todo = launch.pending(results, str(config), module, seeds=2)
    assert [p.name for p in todo] == ["shape_new_seed0", "shape_small_seed1", "shape_new_seed1"]
    small = json.loads((store.point_path(results / "size_like", "shape", "small", 0) / "result.json").read_text())
    assert small["shared_from"] == "heads/h4/seed0" and small["test_bleu"] == 36.0
    assert store.read_spec(results / "size_like")["contrasts"] == [["shrink", "big", "small"]]


FAKE_POINT = """import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[sys.argv.index("--workdir") + 1])
def stop(signum, frame):
    (out / "terminated").write_text(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
(out / "started").write_text("")
time.sleep(120)
"""


def test_sigterm_to_the_sweep_reaches_its_running_point(tmp_path):
    # Killing a sweep must not orphan the point it runs (which would train on, unseen): the point gets the
    # SIGTERM too (a real one checkpoints on it), and the sweep waits for it before it exits.
    (tmp_path / "point.py").write_text(FAKE_POINT)
    code = (
        "import sys; from pathlib import Path; from sweeps import launch; "
        f"launch.run_sweep([sys.executable, {str(tmp_path / 'point.py')!r}], {str(CONFIG)!r}, Path({str(tmp_path)!r}), "
        f"Path({str(tmp_path / 'results')!r}), 1)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    for _ in range(600):
        if (tmp_path / "started").exists() or parent.poll() is not None:
            break
        time.sleep(0.1)
    assert (tmp_path / "started").exists(), parent.communicate()[0]
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) == 128 + signal.SIGTERM
    assert (tmp_path / "terminated").read_text() == str(int(signal.SIGTERM))


def test_heads_budget_doubles_only_the_steps():
    # The 8,000-step runs are rows A's points with twice the steps and the cadence tied to them; warm-up and the
    # cosine's shape stay (300 steps, then down to zero at the last step).
    for h in (8, 32):
        rows_a = flat(ablation_heads.get_config(f"h={h}"))
        longer = flat(ablation_heads_budget.get_config(f"run=h{h}_8000"))
        assert {k: v for k, v in longer.items() if rows_a[k] != v} == {
            "num_train_steps": 8000,
            "eval_every_steps": 800,
            "checkpoint_every_steps": 800,
        }
        assert (longer["optimizer.warmup_steps"], longer["optimizer.schedule"]) == (300, "cosine")
    schema.load_module(ROOT / "configs/ablation_heads_budget.py")  # a valid sweep config
    for arg in ("run=h16_8000", "h=8", "run="):
        with pytest.raises(ValueError, match="run="):
            ablation_heads_budget.get_config(arg)


def test_head_size_shapes_cross_heads_and_width():
    # h32_dk8 spells out rows A's h = 32 point; h32_dk16 and h8_dk8 let the attention width h * d_k leave d_model.
    heads32 = flat(ablation_heads.get_config("h=32"))
    h32_dk8 = flat(ablation_head_size.get_config("shape=h32_dk8"))
    assert {k: v for k, v in h32_dk8.items() if heads32[k] != v} == {"model.head_dim": 8, "model.v_head_dim": 8}
    for shape, (h, d) in {"h8_dk8": (8, 8), "h32_dk16": (32, 16)}.items():
        model = ablation_head_size.get_config(f"shape={shape}").model
        assert (model.num_heads, model.head_dim, model.v_head_dim, model.d_model) == (h, d, d, 256)
    schema.load_module(ROOT / "configs/ablation_head_size.py")  # a valid sweep config
    for arg in ("shape=h16_dk16", "h=32", "shape="):
        with pytest.raises(ValueError, match="shape="):
            ablation_head_size.get_config(arg)


def test_adopt_stored_copies_the_seeds_the_other_sweep_gained_later(tmp_path):
    # Rows A gains seeds 2 and 3 of h = 8 after the KV sweep was started with 2 seeds: --adopt brings both in,
    # leaves the seeds it already holds and the other sweep's unshared values alone, and a second call is a no-op.
    results = tmp_path / "results"
    store.write_spec(results / "heads", {"key": "h"})
    (results / "heads" / "spm.model").write_bytes(b"vocabulary")
    for seed in range(4):
        write_finished(results / "heads", "h", 8, seed, 40.0 + seed)
    write_finished(results / "heads", "h", 4, 2, 39.0)
    config = tmp_path / "kv_like.py"
    config.write_text(
        GOOD.replace('"s"', '"kv_like"').replace('"h"', '"kv"') + 'SWEEP_SHARED_REFERENCE = ("heads", 8)\n'
    )
    module = schema.load_module(config)
    with pytest.raises(FileNotFoundError, match="start the sweep"):
        adopt.adopt_stored(module, results)  # never started: no sweep.json for --collect to read
    launch.pending(results, str(config), module, seeds=2)
    assert [p.name for p in adopt.adopt_stored(module, results)] == ["kv2_seed2", "kv2_seed3"]
    stored = json.loads((store.point_path(results / "kv_like", "kv", 2, 3) / "result.json").read_text())
    assert stored["shared_from"] == "heads/h8/seed3" and stored["test_bleu"] == 43.0
    assert not store.point_path(results / "kv_like", "kv", 1, 2).exists()
    assert adopt.adopt_stored(module, results) == []


def test_the_blocked_replication_repeats_the_head_size_shapes_on_fresh_seeds():
    module = schema.load_module(ROOT / "configs/head_size_blocked.py")
    for shape in ("h8_dk32", "h8_dk8", "h32_dk8", "h32_dk16"):  # the head-size sweep's 2 x 2, config for config
        assert flat(head_size_blocked.get_config(f"shape={shape}")) == flat(
            ablation_head_size.get_config(f"shape={shape}")
        ), shape
    split = flat(head_size_blocked.get_config("shape=h8_dk32_dv8"))
    reference = flat(head_size_blocked.get_config("shape=h8_dk32"))
    assert {k: v for k, v in split.items() if reference[k] != v} == {"model.v_head_dim": 8}
    assert [p.seed for p in schema.points(module, 5)] == [s for s in range(10, 15) for _ in module.SWEEP_VALUES]
    assert not getattr(module, "SWEEP_SHARED", None) and not getattr(module, "SWEEP_SHARED_REFERENCE", None)


@pytest.mark.parametrize("first", ["-1", "True", "'10'"])
def test_a_bad_first_seed_is_named(tmp_path, first):
    path = tmp_path / "bad.py"
    path.write_text(GOOD + f"SWEEP_FIRST_SEED = {first}\n")
    with pytest.raises(ValueError, match="SWEEP_FIRST_SEED"):
        schema.load_module(path)


TABLE3_SWEEPS = (
    "ablation_heads",
    "ablation_kv",
    "ablation_dk",
    "ablation_family",
    "ablation_family_long",
    "ablation_heads_budget",
    "ablation_head_size",
    "head_size_blocked",
)


@pytest.mark.parametrize("name", TABLE3_SWEEPS)
def test_the_packed_preset_is_a_config_argument_and_a_sweep_of_its_own(name, tmp_path):
    # train.py's --config configs/X.py:KEY=VALUE,packed, and sweep.py's --config configs/X.py:packed
    plain, packed = (
        schema.load_module(ROOT / f"configs/{name}.py"),
        schema.load_module(f"{ROOT}/configs/{name}.py:packed"),
    )
    assert packed.SWEEP_NAME == f"{plain.SWEEP_NAME}_packed" != plain.SWEEP_NAME  # results/NAME_packed/, apart
    arg = f"{plain.SWEEP_KEY}={plain.SWEEP_VALUES[-1]}"
    bucketed, variant = plain.get_config(arg), plain.get_config(f"{arg},packed")
    assert bucketed.data.pack_length == 0 and tuple(bucketed.eval.lengths) == ()
    assert variant.data.pack_length == 64 and tuple(variant.eval.lengths) == (64, variant.model.max_len) == (64, 256)
    assert {k: v for k, v in flat(variant).items() if flat(bucketed)[k] != v} == {
        "data.pack_length": 64,
        "eval.lengths": (64, 256),
    }
    assert flat(packed.get_config(arg)) == flat(variant) and flat(plain.get_config("packed")) == flat(
        packed.get_config(None)
    )
    # the sweep's points keep their plain arguments; the packed sweep shares only packed sweeps' runs
    assert [p.arg for p in schema.points(packed, 1)] == [p.arg for p in schema.points(plain, 1)]
    assert {v: (o + "_packed", ov) for v, (o, ov) in schema.shared_points(plain).items()} == schema.shared_points(
        packed
    )
    command = launch.point_command(
        ["sweep.py"], f"configs/{name}.py:packed", tmp_path, tmp_path, schema.points(packed, 1)[0]
    )
    assert command[command.index("--config") + 1] == f"configs/{name}.py:packed"


def test_a_variant_the_sweep_does_not_offer_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"offers the variants \('packed',\)"):
        schema.load_module(f"{ROOT}/configs/ablation_heads.py:float32")
    (tmp_path / "plain.py").write_text(GOOD)
    with pytest.raises(ValueError, match=r"offers the variants \(\)"):
        schema.load_module(f"{tmp_path}/plain.py:packed")
