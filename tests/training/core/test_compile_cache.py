"""The persistent compilation cache: its config field, its directory, and a second process that compiles nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from configs import default
from training import config as config_lib
from training.core import compile_cache

ROOT = Path(__file__).resolve().parents[3]

# A fresh process: enable the cache in argv[1], jit a small function, print what was compiled and loaded.
PROGRAM = """
import json, sys
import jax, jax.numpy as jnp
from training.core import compile_cache
compile_cache.enable(sys.argv[1])
with compile_cache.CompileCounter() as counter:
    y = jax.jit(lambda x: jnp.tanh(x) @ x.T + 1.0)(jnp.arange(12.0).reshape(3, 4))
print(json.dumps({**counter.totals(), "sum": float(y.sum())}))
"""


def run_program(cache):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(cache)], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    first, second = run_program(tmp_path / "cache"), run_program(tmp_path / "cache")
    assert first["compiled"] >= 1 and first["cache_loaded"] == 0  # a sub-second CPU compile is cached too
    assert second["compiled"] == 0 and second["cache_loaded"] == first["compiled"]
    assert second["sum"] == first["sum"]


@pytest.mark.parametrize("setting", [3, None])
def test_the_config_field_must_be_a_string(setting):
    config = default.get_config()
    del config["compilation_cache_dir"]  # a str field; the config file could still set any type
    config.compilation_cache_dir = setting
    with pytest.raises(ValueError, match="config.compilation_cache_dir"):
        config_lib.validate(config)


def test_the_config_field_must_not_name_a_file(tmp_path):
    config = default.get_config()
    config.compilation_cache_dir = str(tmp_path / "a_file")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match="config.compilation_cache_dir = '.*a_file'"):
        config_lib.validate(config)
    config.compilation_cache_dir = str(tmp_path / "a_new_dir")
    config_lib.validate(config)


def test_cache_directories(tmp_path, monkeypatch):
    assert compile_cache.cache_dir("") is None
    assert compile_cache.cache_dir("~/jax") == Path.home() / "jax"
    assert compile_cache.cache_dir("auto") == Path(
        jax.config.jax_compilation_cache_dir
    )  # the test session's (conftest)
    saved = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        assert compile_cache.cache_dir("auto") == tmp_path / "headcount" / "jax"
        monkeypatch.delenv("XDG_CACHE_HOME")
        assert compile_cache.cache_dir("auto") == Path.home() / ".cache" / "headcount" / "jax"
    finally:
        jax.config.update("jax_compilation_cache_dir", saved)


def test_an_older_config_json_gets_the_default_cache():
    config = default.get_config()
    del config["compilation_cache_dir"]
    assert config_lib.complete(config).compilation_cache_dir == "auto"
