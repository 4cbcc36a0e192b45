"""model.dtype 'auto': one check per machine, kept; a run records what it resolved and a resume keeps it."""

import json

import jax.numpy as jnp
import pytest

from tiny import train_config as tiny_config
from training import config as config_lib
from training.core import precision

BF16_FASTER = {"dtype": "bfloat16", "float32_s": 2.0, "bfloat16_s": 1.0}
F32_FASTER = {"dtype": "float32", "float32_s": 1.0, "bfloat16_s": 1.0}


def never():
    raise AssertionError("measured again")


def test_the_check_runs_once_per_machine_and_is_kept(tmp_path):
    calls = []
    measure = lambda: calls.append(1) or dict(BF16_FASTER)
    assert precision.resolve("auto", tmp_path, measure) == "bfloat16"
    assert precision.resolve("auto", tmp_path, never) == "bfloat16"  # read back from the cache directory
    assert calls == [1]
    kept = json.loads((tmp_path / precision.CHOICES_FILE).read_text())
    assert list(kept) == [precision.machine_key()] and kept[precision.machine_key()]["bfloat16_s"] == 1.0
    assert precision.resolve("float32", tmp_path / "elsewhere", never) == "float32"  # a set dtype is not checked


def test_without_a_cache_directory_the_check_runs_each_time():
    assert precision.resolve("auto", None, lambda: dict(F32_FASTER)) == "float32"
    assert precision.resolve("auto", None, lambda: dict(BF16_FASTER)) == "bfloat16"


def test_the_check_picks_bfloat16_only_when_clearly_faster(monkeypatch):
    times = {"float32": 1.0, "bfloat16": 1.0 / precision.MIN_SPEEDUP * 1.01}
    monkeypatch.setattr(precision, "matmul_seconds", lambda dtype, shape, matmul: times[jnp.dtype(dtype).name])
    assert precision.measure()["dtype"] == "float32"
    times["bfloat16"] = 1.0 / precision.MIN_SPEEDUP / 1.01
    assert precision.measure()["dtype"] == "bfloat16"


def test_each_matmul_setting_has_its_own_verdict(tmp_path, monkeypatch):
    # The check times the products the model will run: xla's and row_major's can rank the dtypes differently.
    timed = []
    times = {"xla": {"float32": 1.0, "bfloat16": 2.0}, "row_major": {"float32": 2.0, "bfloat16": 1.0}}
    monkeypatch.setattr(
        precision,
        "matmul_seconds",
        lambda dtype, shape, matmul: timed.append(matmul) or times[matmul][jnp.dtype(dtype).name],
    )
    assert precision.resolve("auto", tmp_path, matmul="xla") == "float32"
    assert precision.resolve("auto", tmp_path, matmul="row_major") == "bfloat16"
    assert timed == ["xla", "xla", "row_major", "row_major"]
    assert precision.resolve("auto", tmp_path, never, matmul="xla") == "float32"  # both kept
    kept = json.loads((tmp_path / precision.CHOICES_FILE).read_text())
    assert sorted(v["matmul"] for v in kept.values()) == ["row_major", "xla"]


def test_a_workdir_keeps_the_dtype_its_run_started_with(tmp_path):
    workdir, cache = tmp_path / "run", tmp_path / "cache"
    workdir.mkdir()
    assert precision.run_dtype("float32", workdir, cache, never)[0] == "float32"
    dtype, info = precision.run_dtype("auto", workdir, cache, lambda: dict(BF16_FASTER))
    assert dtype == "bfloat16" and info["model.dtype"]["dtype"] == "bfloat16"
    (workdir / precision.RUN_INFO).write_text(json.dumps(info))
    assert precision.run_dtype("auto", workdir, tmp_path / "another_machine", lambda: dict(F32_FASTER))[0] == "bfloat16"


def test_a_workdir_from_before_auto_keeps_its_dtype(tmp_path):
    config = tiny_config()
    config.model.dtype = "float32"
    (tmp_path / "config.json").write_text(config.to_json_best_effort())
    config.model.dtype = "auto"
    config_lib.check_resumable(config, tmp_path / "config.json")  # 'auto' continues a float32 run ...
    assert precision.run_dtype("auto", tmp_path, None, never)[0] == "float32"  # ... in float32
    config.model.dtype = "bfloat16"
    with pytest.raises(ValueError, match="config.model.dtype"):
        config_lib.check_resumable(config, tmp_path / "config.json")


def test_a_preset_point_from_before_matmul_auto_resumes_and_a_real_change_is_refused(tmp_path):
    config = tiny_config()
    config.model.matmul = "row_major"  # the Table 3 preset's setting before it took "auto"
    (tmp_path / "config.json").write_text(config.to_json_best_effort())
    config.model.matmul = "auto"
    config_lib.check_resumable(config, tmp_path / "config.json")
    config.model.matmul = "xla"
    with pytest.raises(ValueError, match="config.model.matmul"):
        config_lib.check_resumable(config, tmp_path / "config.json")
