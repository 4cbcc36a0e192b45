"""Seeds trained stacked (training/run/stacked_run.py) write the runs they would alone: each seed's logged losses and
dev metrics within 1e-5 (relative) of its single run's, its workdir read back as any run's; a stacked job killed
after a checkpoint resumes bit-identically; a diverged seed stops alone while the others train exactly as before;
bad input is refused in one line naming the value.

The end-to-end tests (tiny model, Multi30k) are marked slow; the refusals are fast.
"""

import json
import os
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from models import Transformer
from tiny import model_config
from training.core import files
from training.core.errors import RunRefused
from training.evaluation.loaded import load_run
from training.parallel import stacked
from training.run import divergence, loop, stacked_run
from sweeps import launch, schema

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests/sweeps"))
import tiny_stacked_sweep  # noqa: E402

SEEDS = [0, 1]


def config():
    return tiny_stacked_sweep.get_config("h=2")


def records(workdir: Path) -> list[dict]:
    return files.read_jsonl(workdir / "metrics.jsonl")


def params_of(workdir: Path):
    return jax.device_get(load_run(workdir).params)


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Seeds 0 and 1 trained alone (the training loop) and stacked, on one vocabulary."""
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    root = tmp_path_factory.mktemp("stacked")
    for seed in SEEDS:
        alone = config()
        alone.seed = seed
        if seed:  # every seed on seed 0's vocabulary, as a sweep's points share one
            (root / f"alone{seed}").mkdir()
            (root / f"alone{seed}" / "spm.model").write_bytes((root / "alone0" / "spm.model").read_bytes())
        loop.train_and_evaluate(alone, root / f"alone{seed}")
    vocab = (root / "alone0" / "spm.model").read_bytes()
    result = stacked_run.train_stacked(
        config(), SEEDS, root / "stack", [root / "stack" / f"seed{s}" for s in SEEDS], vocab_proto=vocab
    )
    return root, vocab, result


@pytest.mark.slow
def test_each_stacked_seed_writes_the_run_it_would_alone(trained):
    root, _, result = trained
    assert [r["step"] for r in result] == [6, 6]
    for seed in SEEDS:
        alone, together = records(root / f"alone{seed}"), records(root / "stack" / f"seed{seed}")
        assert [(r["step"], r.get("split")) for r in together] == [(r["step"], r.get("split")) for r in alone]
        for a, t in zip(alone, together):
            for name in ("loss", "nll", "perplexity", "bleu"):
                if name in a:
                    np.testing.assert_allclose(t[name], a[name], rtol=1e-5, err_msg=f"seed {seed} {name} {a['step']}")
        assert json.loads((root / "stack" / f"seed{seed}" / "config.json").read_text())["seed"] == seed
        assert json.loads((root / "stack" / f"seed{seed}" / stacked_run.STACKED_FILE).read_text())["seeds"] == SEEDS
        # the seed's workdir is read back as any run (best/ first), its parameters those of its run alone
        jax.tree.map(
            lambda t, a: np.testing.assert_allclose(t, a, rtol=1e-4, atol=1e-6),
            params_of(root / "stack" / f"seed{seed}"),
            params_of(root / f"alone{seed}"),
        )
    first_losses = {records(root / "stack" / f"seed{s}")[0]["loss"] for s in SEEDS}
    assert len(first_losses) == 2  # the seeds' own data and initialisation


@pytest.mark.slow
def test_a_killed_stacked_job_resumes_bit_identically(trained, tmp_path, monkeypatch):
    root, vocab, _ = trained
    dirs = [tmp_path / f"seed{s}" for s in SEEDS]
    original = stacked_run.Prefetch.get

    def killed_at_step_5(self, step):  # after the checkpoint at step 3
        if step == 4:
            raise Killed
        return original(self, step)

    monkeypatch.setattr(stacked_run.Prefetch, "get", killed_at_step_5)
    with pytest.raises(Killed):
        stacked_run.train_stacked(config(), SEEDS, tmp_path, dirs, vocab_proto=vocab)
    monkeypatch.setattr(stacked_run.Prefetch, "get", original)
    stacked_run.train_stacked(config(), SEEDS, tmp_path, dirs, vocab_proto=vocab)
    for seed, directory in zip(SEEDS, dirs):
        assert_same_but_times(records(directory), records(root / "stack" / f"seed{seed}"))
        jax.tree.map(np.testing.assert_array_equal, params_of(directory), params_of(root / "stack" / f"seed{seed}"))


def assert_same_but_times(a: list[dict], b: list[dict]) -> None:
    """Equal records but for what a clock or the compile cache sets."""
    timed = ("tokens_per_s", "step_time_s", "data_fraction", "compiled", "compile_s", "cache_loaded", "first_step_s")
    assert [{k: v for k, v in r.items() if k not in timed} for r in a] == [
        {k: v for k, v in r.items() if k not in timed} for r in b
    ]


@pytest.mark.slow
def test_a_diverged_seed_stops_alone_and_the_others_train_as_before(trained, tmp_path, monkeypatch):
    root, vocab, _ = trained
    made = []
    original = stacked_run.loss_watch

    def watch(*args):
        made.append(original(*args))
        if len(made) == 2:  # seed 1's: its loss at step 2 reads as a blow-up
            made[-1].check = lambda loss, calls=[]: calls.append(loss) or ("loss is nan" if len(calls) == 2 else None)
        return made[-1]

    monkeypatch.setattr(stacked_run, "loss_watch", watch)
    dirs = [tmp_path / f"seed{s}" for s in SEEDS]
    result = stacked_run.train_stacked(config(), SEEDS, tmp_path, dirs, vocab_proto=vocab)
    assert result[1] is None and result[0]["step"] == 6
    assert [r["step"] for r in records(dirs[1])] == [1]  # logged until it diverged at step 2
    assert (dirs[1] / divergence.DIVERGED_FILE).is_file()
    assert_same_but_times(records(dirs[0]), records(root / "stack" / "seed0"))  # seed 0 trained exactly as before
    jax.tree.map(np.testing.assert_array_equal, params_of(dirs[0]), params_of(root / "stack" / "seed0"))


# ---- refusals: one line naming the value and what fits


def test_a_bucketed_config_is_refused_for_stacking():
    bucketed = config()
    bucketed.data.pack_length = 0
    with pytest.raises(ValueError, match=r"config.data.pack_length = 0 .* expected a packed config"):
        stacked_run.check_stack(bucketed, SEEDS, [Path("a"), Path("b")])
    with pytest.raises(ValueError, match=r"stacked seeds \[0, 0\]; expected one or more distinct seeds"):
        stacked_run.check_stack(config(), [0, 0], [Path("a"), Path("b")])


def test_a_stacked_job_resumed_with_other_seeds_is_refused(tmp_path):
    (tmp_path / stacked_run.STACK_FILE).write_text(json.dumps({"seeds": [0, 1, 2]}))
    stacked_run.check_resumable_stack(tmp_path, [0, 1, 2])  # its own seeds resume
    with pytest.raises(
        RunRefused, match=r"seeds \[0, 1, 2\] \(--stack_seeds 3\); got seeds \[0, 1\] \(--stack_seeds 2\)"
    ):
        stacked_run.check_resumable_stack(tmp_path, [0, 1])


def test_more_seeds_than_a_device_holds_are_refused_naming_what_fits(monkeypatch):
    net = Transformer(model_config(d_model=16, num_heads=2, num_layers=1, mlp_dim=24, max_len=16))
    trainer = stacked.StackedTrainer(net, optax.adam(1e-3), 0.1, 8, jax.devices()[:1])
    monkeypatch.setattr(stacked_run, "device_memory", lambda device: 4 * stacked_run.GIB)
    stacked_run._check_memory(4 * stacked_run.GIB, trainer)  # exactly fits
    with pytest.raises(
        ValueError, match=r"--stack_seeds 8: .* needs 8.00 GiB a device, .* 4.00 GiB .* about 4 seeds fit"
    ):
        stacked_run._check_memory(8 * stacked_run.GIB, trainer)


def test_stacks_group_a_points_seeds_and_the_launcher_starts_one_process_a_stack(tmp_path):
    module = tiny_stacked_sweep
    points = schema.points(module, 5)
    stacks = schema.stacks(points, 2)
    assert [s.seeds for s in stacks] == [[0, 1], [2, 3], [4]] and stacks[0].name == "h2_seeds0-1"
    command = launch.point_command(["sweep.py"], "c.py", tmp_path, tmp_path / "r", stacks[0])
    assert command[-4:] == ["--point", "h=2", "--stacked_seeds", "0,1"]
    with pytest.raises(ValueError, match=r"--stack_seeds must be a positive int, got 0"):
        schema.stacks(points, 0)
    # a stacked job of other seeds of the same point, unfinished in WORKDIR: refused before anything starts
    (tmp_path / "h2_seeds0-1-2").mkdir()
    (tmp_path / "h2_seeds0-1-2" / stacked_run.STACK_FILE).write_text(json.dumps({"seeds": [0, 1, 2]}))
    with pytest.raises(ValueError, match=r"seeds \[0, 1, 2\] \(--stack_seeds 3\); resume it with --stack_seeds 3"):
        launch.check_stacks(module, stacks, tmp_path)
    bucketed = type("M", (), {"get_config": staticmethod(lambda arg: _bucketed())})
    with pytest.raises(ValueError, match=r"point h=2 trains on length buckets"):
        launch.check_stacks(bucketed, stacks, tmp_path / "empty")


def _bucketed():
    c = config()
    c.data.pack_length = 0
    return c
