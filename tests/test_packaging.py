"""The distribution from a user's side: the wheel installs `attention` with jax and flax alone, and works
from another folder in a Flax Linen and an NNX model (GQA, one training step, one decode step), while none
of the research application's packages can be imported there.

Slow: it builds the wheel and installs jax and flax into a fresh venv (pip's cache helps).
"""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APPLICATION = ("models", "training", "backends", "sweeps", "analysis", "experiments", "bench", "configs")

USER_CODE = """
import importlib, sys
import jax, jax.numpy as jnp
import flax.linen as nn
from flax import nnx
import attention

assert "site-packages" in attention.__file__, attention.__file__


class Block(nn.Module):
    decode: bool = False

    @nn.compact
    def __call__(self, x):
        y = attention.MultiHeadAttention(num_heads=4, num_kv_heads=2, decode=self.decode)(x, is_causal=not self.decode)
        return nn.Dense(1)(y + x)


x = jax.random.normal(jax.random.key(0), (2, 8, 32))
params = Block().init(jax.random.key(1), x)["params"]
loss = lambda p: jnp.mean(Block().apply({"params": p}, x) ** 2)
before, grads = jax.value_and_grad(loss)(params)
params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)       # one SGD step
assert float(loss(params)) < float(before)
cache = Block(decode=True).init(jax.random.key(1), x)["cache"]      # a cache of 8 positions
y, state = Block(decode=True).apply({"params": params, "cache": cache}, x[:, :1], mutable=["cache"])
assert y.shape == (2, 1, 1)

layer = attention.nnx.MultiHeadAttention(4, 32, num_kv_heads=2, rngs=nnx.Rngs(0))
optimizer_free_loss = lambda model: jnp.mean(model(x) ** 2)
grads = nnx.grad(optimizer_free_loss)(layer)
nnx.update(layer, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(layer, nnx.Param), grads))
layer.init_cache((2, 8, 32))
assert layer(x[:, :3], decode=True).shape == (2, 3, 32)          # prefill, then one step
assert layer(x[:, 3:4], decode=True).shape == (2, 1, 32)

for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        continue
    raise SystemExit(f"{name} is importable from the library's venv")
print("ok", attention.__version__)
"""


@pytest.mark.slow
def test_the_wheel_installs_attention_alone_and_works_from_elsewhere(tmp_path):
    wheels, venv, elsewhere = tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = lambda *cmd, cwd=ROOT: subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1200)
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT))
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("headcount-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/", 1)[0] for name in archive.namelist()}
    assert {t for t in top if not t.endswith(".dist-info")} == {"attention"}

    assert run(sys.executable, "-m", "venv", str(venv)).returncode == 0
    python = venv / "bin" / "python"
    installed = run(str(python), "-m", "pip", "install", "-q", "-c", str(ROOT / "requirements.lock"), str(wheel))
    assert installed.returncode == 0, installed.stderr[-2000:]
    names = run(str(python), "-m", "pip", "list", "--format=freeze").stdout.lower()
    for research_only in (
        "tensorflow-datasets",
        "sacrebleu",
        "sentencepiece",
        "submitit",
        "ml-collections",
        "tensorboardx",
    ):
        assert f"\n{research_only}==" not in f"\n{names}", research_only

    (elsewhere / "user.py").write_text(USER_CODE)
    used = run(str(python), "user.py", *APPLICATION, cwd=elsewhere)
    assert used.returncode == 0, used.stderr[-3000:]
    assert used.stdout.split() == ["ok", __import__("attention").__version__]
