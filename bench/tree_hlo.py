"""Two checkouts of this repository side by side: do they compile the same XLA:CPU programs?

    MULTI30K_DIR=... JAX_PLATFORMS=cpu taskset -c 0 python -m bench.tree_hlo BEFORE_TREE AFTER_TREE

A refactor that should change no computation is checked here, beside `bench/tree_ratio.py`'s timings:
each tree gets one worker process started inside it (its own `attention`, `models`, `bench` imported:
Python puts the working directory first on `sys.path`), which compiles, for this host's CPU, `attend`
with each CPU implementation, a Linen and an NNX decode step (GQA 8/2, the XLA:CPU backend's
formulation), a toy Transformer's greedy and beam search and train gradient, and the small model's
beam search (beam 4, 20 sources, 63 steps; Multi30k's vocabulary) and train step (the training loop's
trainer on the shortest bucket of the first 3,000 training pairs) in float32 and bfloat16. Each
program's optimized HLO is stripped of metadata, source locations and instruction numbers and hashed;
the table prints both trees' hashes and instruction counts and whether they agree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench.lib import cpu_description
from training.core.markdown import markdown_table

# the worker: the code of whichever tree it runs in; prints {program: [hash, instructions]}
WORKER = r"""
import hashlib, json, re
import jax, jax.numpy as jnp
from flax import nnx
import attention
import attention.nnx
from backends import xla_cpu
from bench.lib import SIZES, Ours, corpus_vocab, our_config
from configs import default
from models import Transformer, TransformerConfig, beam_search, greedy_decode
from training import config as config_lib

def stripped(compiled):
    text = re.sub(r", metadata=\{[^}]*\}", "", compiled.as_text())
    lines = [l for l in text.splitlines() if re.match(r"^\s*(ROOT )?[%a-zA-Z_][^ ]* = |ENTRY|^[a-z_%].*\{$", l)]
    text = re.sub(r",? ?stack_frame_id=\d+", "", re.sub(r"\.\d+", "", "\n".join(lines)))
    return [hashlib.sha256(text.encode()).hexdigest()[:16], len(lines)]

out, F = {}, xla_cpu.FORMULATION
q, k = jnp.ones((2, 9, 8, 16)), jnp.ones((2, 11, 2, 16))
for impl in ("vmap", "einsum", "xla", "blockwise"):
    f = jax.jit(lambda q, k, v, impl=impl: attention.dot_product_attention(q, k, v, impl=impl, is_causal=True))
    out[f"attend {impl}"] = stripped(f.lower(q, k, k).compile())
layer = attention.MultiHeadAttention(num_heads=8, num_kv_heads=2, decode=True, formulation=F)
variables = jax.jit(layer.init)(jax.random.key(0), jnp.ones((4, 64, 128)))
step = lambda params, cache, x: layer.apply({"params": params, "cache": cache}, x, mutable=["cache"])
lowered = jax.jit(step, donate_argnums=1).lower(variables["params"], variables["cache"], jnp.ones((4, 1, 128)))
out["Linen decode step"] = stripped(lowered.compile())
nnx_layer = attention.nnx.MultiHeadAttention(8, 128, num_kv_heads=2, formulation=F, rngs=nnx.Rngs(0))
nnx_layer.init_cache((4, 64, 128))
graph, state = nnx.split(nnx_layer)
def nnx_step(state, x):
    module = nnx.merge(graph, state)
    return module(x, decode=True), nnx.state(module)
out["NNX decode step"] = stripped(jax.jit(nnx_step, donate_argnums=0).lower(state, jnp.ones((4, 1, 128))).compile())
toy = dict(vocab_size=20, d_model=32, num_heads=4, num_kv_heads=2, num_layers=2, mlp_dim=48, max_len=16, formulation=F)
model = Transformer(TransformerConfig(**toy, dropout_rate=0.0))
src, tgt = jnp.ones((2, 7), jnp.int32), jnp.ones((2, 5), jnp.int32)
params = model.init(jax.random.key(0), src, tgt)["params"]
search = lambda p, s: beam_search(model, p, s, beam_size=4, max_len=16)
out["toy beam search"] = stripped(jax.jit(search).lower(params, src).compile())
greedy = lambda p, s: greedy_decode(model, p, s, max_len=16)
out["toy greedy"] = stripped(jax.jit(greedy).lower(params, src).compile())
trained = Transformer(TransformerConfig(**toy, dropout_rate=0.1))
loss = lambda p, key: trained.apply({"params": p}, src, tgt, train=True, rngs={"dropout": key}).sum()
out["toy train gradient"] = stripped(jax.jit(jax.grad(loss)).lower(params, jax.random.key(1)).compile())
config = default.get_config()
_, vocab = corpus_vocab(config)
config.model.update(SIZES["small"][0])
for dtype in ("float32", "bfloat16"):
    small = config_lib.build_model(config, vocab, dtype)
    tokens = jnp.ones((1, 2), jnp.int32)
    small_params = jax.jit(small.init)(jax.random.key(0), tokens, tokens)["params"]
    search = jax.jit(lambda p, s: beam_search(small, p, s, beam_size=4, alpha=0.6, max_len=63)[0])
    out[f"small beam search {dtype}"] = stripped(search.lower(small_params, jnp.ones((20, 32), jnp.int32)).compile())
train, _ = corpus_vocab(config)
src_ids, tgt_ids = vocab.encode(list(train.src[:3000])), vocab.encode(list(train.tgt[:3000]))
for dtype in ("float32", "bfloat16"):  # the training loop's trainer, as bench/code_choices.py measures it
    ours = Ours(our_config("small", dtype, {}), vocab, src_ids, tgt_ids, 1)
    shape = min(ours.batches)
    batch = ours.trainer.put_batch(ours.batches[shape][0])
    lowered = ours.trainer.step_fn.lower(ours.state, batch, ours.rng)
    out[f"small train step {dtype} {shape}"] = stripped(lowered.compile())
print(json.dumps(out))
"""


def programs(tree: str) -> dict:
    """{program: [hash, instructions]} as `tree`'s code compiles them."""
    done = subprocess.run([sys.executable, "-c", WORKER], cwd=tree, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", help="the checkout before the change")
    parser.add_argument("after", help="the checkout with the change")
    args = parser.parse_args()
    import jax

    print(cpu_description())
    print(f"jax {jax.__version__}; before {args.before}, after {args.after}\n", flush=True)
    before, after = programs(args.before), programs(args.after)
    rows = []
    for name in before:
        (b_hash, b_lines), (a_hash, a_lines) = before[name], after.get(name, ["-", 0])
        rows.append([name, b_hash, a_hash, f"{b_lines:,}, {a_lines:,}", "yes" if b_hash == a_hash else "**no**"])
    print(markdown_table(["program", "before", "after", "instructions (before, after)", "same"], rows, "lllrl"))


if __name__ == "__main__":
    main()
