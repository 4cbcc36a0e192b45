"""MHA -> GQA/MQA uptraining (Ainslie et al. 2023): convert a trained checkpoint's K/V heads, train on.

Each group of H/G consecutive query heads shares one KV head (the grouping of
`attention.dot_product_attention`). Conversion methods for the group's K and V projections
(kernels `[D, H, Dk]` -> `[D, G, Dk]`, biases `[H, Dk]` -> `[G, Dk]`):
  mean   -- the mean of the group's heads (the paper's method);
  first  -- the group's first head;
  random -- a fresh initialisation, as the GQA model's own `init` draws it;
  mha    -- no conversion: the MHA model trained for the same steps (the extra-training control).
The optimizer state goes along: Adam's moments are mean-pooled / taken from the first head like
the parameters (zeros for random), and the step counters are kept, so the learning-rate schedule
and bias correction continue where the original run stopped. Training itself is the ordinary
`training.run.loop.train_and_evaluate`, resumed from the converted state saved in a new workdir.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp

from analysis import workdir as workdir_lib
from training import checkpoints, config as config_lib
from training.core import files, step as step_lib
from training.evaluation import evaluate
from training.evaluation.loaded import load_run
from training.run import loop

METHODS = ("mean", "first", "random", "mha")


def convert_kv(tree, num_heads: int, num_kv_heads: int, how: str, fresh=None):
    """`tree` (params, or optimizer state holding param-shaped moments) with every attention K/V leaf grouped.

    how: "mean" | "first" | "zeros" | "fresh" (take the leaf at the same path in `fresh` params).
    """
    if num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")

    def leaf(path, x):
        names = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
        if len(names) < 2 or names[-2] not in ("key", "value") or names[-1] not in ("kernel", "bias"):
            return x
        if x.shape[-2] != num_heads:
            raise ValueError(
                f"{'/'.join(names)} has {x.shape[-2]} heads; expected num_heads={num_heads} (an MHA model)"
            )
        grouped = x.reshape(*x.shape[:-2], num_kv_heads, num_heads // num_kv_heads, x.shape[-1])
        if how == "mean":
            return grouped.mean(axis=-2)
        if how == "first":
            return grouped[..., 0, :]
        if how == "zeros":
            return jnp.zeros_like(grouped[..., 0, :])
        if how == "fresh":
            node = fresh
            for name in names:
                node = node[name]
            return node
        raise ValueError(f"how must be 'mean', 'first', 'zeros' or 'fresh', got {how!r}")

    return jax.tree_util.tree_map_with_path(leaf, tree)


def convert_state(state, num_heads: int, num_kv_heads: int, method: str, fresh_params=None):
    """A train state with G KV heads from an MHA one (see the module docstring for `method`)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "mha":
        return state
    param_how, moment_how = {"mean": ("mean", "mean"), "first": ("first", "first"), "random": ("fresh", "zeros")}[
        method
    ]
    return state.replace(
        params=convert_kv(state.params, num_heads, num_kv_heads, param_how, fresh_params),
        opt_state=convert_kv(state.opt_state, num_heads, num_kv_heads, moment_how),
    )


def uptrain(
    workdir,
    out_dir,
    num_kv_heads: int,
    method: str,
    fraction: float,
    *,
    bleu_examples: int,
    overwrite: bool = False,
    seed: int = 0,
):
    """Convert `workdir`'s latest checkpoint, train round(fraction x its step) steps in `out_dir`.

    Returns (converted params before training, the new run's config, model, trained params, steps).
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    workdir, out_dir = Path(workdir), Path(out_dir)
    loaded = load_run(workdir)
    config, vocab, model = loaded.config, loaded.vocab, loaded.model
    ckpts = checkpoints.Checkpoints(workdir, config.keep_checkpoints, read_only=True)  # the source run is only read
    state, start = ckpts.restore_latest(step_lib.abstract_state(model, config))
    ckpts.close()
    geometry = model.config.geometry
    heads = geometry.num_heads
    if geometry.kv_sharing != "MHA":
        raise ValueError(
            f"{workdir} holds a model with num_kv_heads={model.config.num_kv_heads}; uptraining starts from MHA"
        )
    steps = max(1, round(fraction * start))

    new_config = copy.deepcopy(config)
    new_config.model.num_kv_heads = heads if method == "mha" else num_kv_heads
    new_config.num_train_steps = start + steps
    new_config.eval_every_steps = new_config.checkpoint_every_steps = start + steps  # evaluate and save at the end
    new_config.log_every_steps = max(1, min(config.log_every_steps, steps))
    new_config.eval.bleu_examples = bleu_examples
    new_config.max_train_seconds = 0.0
    new_config.compilation_cache_dir = (
        jax.config.jax_compilation_cache_dir or ""
    )  # this process's (analyze.py's flag), not the source's
    new_model = config_lib.build_model(new_config, vocab)
    tokens = jnp.ones((1, 2), jnp.int32)
    fresh = new_model.init(jax.random.key(seed), tokens, tokens)["params"]
    converted = convert_state(state, heads, new_config.model.num_kv_heads, method, fresh)

    if out_dir.exists():
        if not overwrite:
            raise FileExistsError(f"{out_dir} exists; delete it or pass --overwrite")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    shutil.copy(workdir / "spm.model", out_dir / "spm.model")
    out_ckpts = checkpoints.Checkpoints(out_dir, new_config.keep_checkpoints)
    out_ckpts.save(start, converted)  # train_and_evaluate resumes from here
    out_ckpts.close()
    # the config the converted checkpoint belongs to: a workdir with checkpoints but no config.json is refused
    files.write_atomic(out_dir / "config.json", new_config.to_json_best_effort(indent=2))
    loop.train_and_evaluate(new_config, out_dir)
    trained = load_run(out_dir)
    return converted.params, new_config, trained.model, trained.params, steps


def compare(
    run,
    corpus,
    num_kv_heads: int,
    methods,
    fraction: float,
    *,
    beam_size: int = 1,
    speed_rows: int = 64,
    overwrite: bool = False,
) -> list[dict]:
    """The uptraining table: the MHA model, then each method before and after uptraining.

    Dev loss and BLEU are on `corpus`; decode speed is greedy on its first `speed_rows` sources,
    the same batch for every model, as a ratio to the MHA model measured in this call.
    """
    src_ids = run.vocab.encode(list(corpus.src[:speed_rows]))
    speed = lambda model, params: {
        "tokens_per_s": evaluate.decoding_speed(
            model,
            params,
            src_ids,
            run.config.data.bucket_lengths,
            beam_sizes=(1,),
            max_extra_length=run.config.eval.max_extra_length,
        )["decode_tokens_per_s_beam1"]
    }
    config, vocab = run.config, run.vocab
    ckpts = checkpoints.Checkpoints(run.workdir, config.keep_checkpoints, read_only=True)
    mha_state, mha_step = ckpts.restore_latest(step_lib.abstract_state(run.model, config))
    ckpts.close()
    heads = run.model.config.num_heads
    base = {
        "heads": heads,
        **workdir_lib.scorer(config, vocab, run.model, corpus, beam_size)(mha_state.params),
        **speed(run.model, mha_state.params),
    }
    rows = [{"model": f"MHA step {mha_step}", "kv_heads": heads, "method": "-", "steps": 0, **base}]
    for method in methods:
        out_dir = run.out_dir / ("uptrain_mha_continue" if method == "mha" else f"uptrain_kv{num_kv_heads}_{method}")
        before, new_config, model, after, steps = uptrain(
            run.workdir, out_dir, num_kv_heads, method, fraction, bleu_examples=len(corpus), overwrite=overwrite
        )
        score = workdir_lib.scorer(new_config, vocab, model, corpus, beam_size)
        kv = model.config.geometry.num_kv_heads
        if method != "mha":
            rows.append(
                {
                    "model": f"G={kv} {method}, converted",
                    "kv_heads": kv,
                    "method": method,
                    "steps": 0,
                    **score(before),
                    **speed(model, before),
                }
            )
        rows.append(
            {
                "model": f"G={kv} {method}, uptrained",
                "kv_heads": kv,
                "method": method,
                "steps": steps,
                **score(after),
                **speed(model, after),
            }
        )
    for r in rows:
        r["speed_vs_mha"] = r["tokens_per_s"] / base["tokens_per_s"]
    return rows


TABLE_FIELDS = ["model", "kv_heads", "steps", "loss", "bleu", "tokens_per_s", "speed_vs_mha"]
