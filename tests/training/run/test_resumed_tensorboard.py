"""A run killed after a checkpoint and resumed: TensorBoard shows each logged step once, the resumed run's values
after the checkpoint (as metrics.jsonl keeps them), not the killed run's beside them."""

import os

import pytest
from tests.training.core.test_metrics import assert_tensorboard_shows_the_jsonl, tensorboard_points
from tiny import train_config as tiny_config  # logs at 5, 10, ...; dev evaluations and checkpoints at 10, 20

from training.core import files
from training.run import loop


class Killed(Exception):
    pass


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_and_resumed_shows_each_step_once_in_tensorboard(tmp_path, monkeypatch):
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    original = loop.Prefetch.get

    def killed_at_step_17(self, step):  # after step 15's log line, before the checkpoint at step 20
        if step == 16:
            raise Killed
        return original(self, step)

    monkeypatch.setattr(loop.Prefetch, "get", killed_at_step_17)
    with pytest.raises(Killed):
        loop.train_and_evaluate(tiny_config(20), tmp_path)
    killed = [r["step"] for r in files.read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert killed == [5, 10, 15] and sorted(
        p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()
    ) == ["10"]
    monkeypatch.setattr(loop.Prefetch, "get", original)
    loop.train_and_evaluate(tiny_config(20), tmp_path)  # resumes at the checkpoint at step 10, redoes 11 to 20
    assert_tensorboard_shows_the_jsonl(tmp_path)
    shown = tensorboard_points(tmp_path / "tensorboard")
    assert sorted(shown["train/loss"]) == [5, 10, 15, 20] and sorted(shown["val/loss"]) == [10, 20]
