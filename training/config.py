"""Start-up validation of a run's ConfigDict, and the model config it implies."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax.numpy as jnp
import ml_collections

import backends
from models import Transformer, TransformerConfig
from training.core import compile_cache, precision
from training.core import step as step_lib
from training.data import corpus
from training.parallel import distributed, sharding

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
DTYPE_SETTINGS = ("auto", *DTYPES)  # "auto": training/core/precision.py
PARALLELISMS = ("jit", "pmap")
# Fields added after the first workdirs were written, with the values that reproduce how those
# runs behaved; `complete` fills them into a config read back from an older config.json. The model's
# own fields need no entry: a missing one gets its `TransformerConfig` default (see `complete`).
ADDED_FIELDS = {
    "max_train_seconds": 0.0,
    "parallelism": "jit",
    "mesh.shard_embeddings": False,
    "distributed.initialize": "auto",
    "distributed.coordinator_address": "",
    "distributed.num_processes": 0,
    "distributed.process_id": -1,
    "model.matmul": "auto",
    "compilation_cache_dir": "auto",  # a cache changes no result
    "optimizer.schedule": "rsqrt",
    "data.pack_length": 0,
    "divergence_factor": 10.0,  # read by the loop only: no saved state depends on it
    "eval.lengths": (),  # evaluation at the buckets' lengths, as before the field
}
# `model.row_major_matmuls` values as `model.matmul` settings (an older config.json may hold the old field).
RENAMED_MATMUL = {True: "row_major", False: "xla", None: "auto"}


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Fill the fields an older workdir's config.json lacks (in place; returned): `ADDED_FIELDS`, and each
    model field with its `TransformerConfig` default (a new field's default keeps the behaviour runs had before it)."""
    model = config.get("model", {})
    if "row_major_matmuls" in model:  # the matmul setting's old name
        old = model.row_major_matmuls
        del model["row_major_matmuls"]
        model.matmul = RENAMED_MATMUL[old]
    for path, value in {**ADDED_FIELDS, **{f"model.{name}": value for name, value in model_defaults().items()}}.items():
        *sections, field = path.split(".")
        node = config
        for section in sections:
            if section not in node:
                node[section] = ml_collections.ConfigDict()
            node = node[section]
        if field not in node:
            node[field] = value
    return config


def load_saved(path: Path) -> ml_collections.ConfigDict:
    """A workdir's config.json, completed with the fields added since it was written (ValueError naming a torn one)."""
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a whole JSON config ({error}); restore it, or start a new --workdir") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{path} holds {type(saved).__name__}, not a JSON config object")
    return complete(ml_collections.ConfigDict(saved))


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise ValueError naming the first bad field (value and what was expected)."""
    _require("model.dtype", config.model.dtype, config.model.dtype in DTYPE_SETTINGS, f"one of {DTYPE_SETTINGS}")
    _require("model.matmul", config.model.matmul, config.model.matmul in backends.MATMULS, f"one of {backends.MATMULS}")
    _require(
        "optimizer.schedule",
        config.optimizer.schedule,
        config.optimizer.schedule in step_lib.SCHEDULES,
        f"one of {step_lib.SCHEDULES}",
    )
    _require(
        "seed",
        config.seed,
        _count(config.seed) and config.seed < 2**32,
        "an int in [0, 2**32) (SentencePiece's and the batches' seed)",
    )
    buckets = config.data.bucket_lengths
    _require(
        "data.bucket_lengths",
        buckets,
        isinstance(buckets, (tuple, list)) and len(buckets) > 0 and all(_count(n) and n >= 2 for n in buckets),
        "a tuple of ints >= 2, such as (16, 32, 64)",
    )
    _check_knobs(config)
    try:  # the model's own checks, reported under the config's field names
        _model_fields(config, config.data.vocab_size)
    except ValueError as error:
        raise ValueError(str(error).replace("TransformerConfig.", "config.model.")) from None
    is_multi30k = config.data.dataset == "multi30k"
    _require(
        "data.dataset",
        config.data.dataset,
        is_multi30k or "/" in config.data.dataset,
        "'multi30k' or a tfds translation name such as 'wmt14_translate/de-en'",
    )
    languages = corpus.MULTI30K_LANGUAGES if is_multi30k else tuple(config.data.dataset.rsplit("/", 1)[-1].split("-"))
    for field in ("src", "tgt"):
        lang = config.data[field]
        _require(f"data.{field}", lang, lang in languages, f"one of {languages} for {config.data.dataset}")
    _require("data.tgt", config.data.tgt, config.data.tgt != config.data.src, "different from data.src")
    for field in ("train_split", "eval_split"):
        corpus.check_split(config, config.data[field], f"config.data.{field}")
    for field in (
        "num_train_steps",
        "log_every_steps",
        "eval_every_steps",
        "checkpoint_every_steps",
        "keep_checkpoints",
    ):
        value = config[field]
        _require(field, value, isinstance(value, int) and value > 0, "a positive int")
    lengths = config.eval.get("lengths", ())
    _require(
        "eval.lengths",
        lengths,
        isinstance(lengths, (tuple, list))
        and all(isinstance(n, int) and n >= 2 for n in lengths)
        and (not lengths or max(lengths) >= config.model.max_len),
        "() (the buckets) or a few lengths >= 2, the longest >= model.max_len to hold every pair",
    )
    _require("max_train_seconds", config.max_train_seconds, config.max_train_seconds >= 0, ">= 0 (0: no limit)")
    _require("parallelism", config.parallelism, config.parallelism in PARALLELISMS, f"one of {PARALLELISMS}")
    for field in ("data", "model"):
        value = config.mesh[field]
        _require(
            f"mesh.{field}",
            value,
            isinstance(value, int) and (value > 0 or value == -1),
            "a positive int or -1 (the rest)",
        )
    if config.parallelism == "pmap":
        _require(
            "mesh.model", config.mesh.model, config.mesh.model == 1, "1 with parallelism='pmap' (data parallel only)"
        )
    elif config.mesh.model > 0:
        sharding.check_model_shards(config.mesh.model, config.model.num_heads, config.model.mlp_dim)
    distributed.check(config.distributed)
    compile_cache.check_setting(config.compilation_cache_dir)


# Sections that shape the train state or its meaning; the rest (steps, logging, eval) may change on resume.
RESUME_FIXED = ("seed", "model", "data", "optimizer")


def check_resumable(config: ml_collections.ConfigDict, saved_path: Path) -> None:
    """A workdir continues only the run it holds: raise if a fixed section differs from `saved_path`."""
    if not saved_path.exists():
        return
    saved = json.loads(load_saved(saved_path).to_json_best_effort())
    current = json.loads(config.to_json_best_effort())
    if (
        current["model"]["dtype"] == "auto" and saved["model"]["dtype"] in DTYPES
    ):  # a run from before "auto" keeps its dtype
        current["model"]["dtype"] = saved["model"]["dtype"]
    # a Table 3 point from before its preset took matmul "auto" (pinned "row_major": the program "auto" gives a
    # 16-bit run on XLA:CPU, and XLA's dots elsewhere, as "row_major" did) resumes under the preset of today
    if current["model"].get("matmul") == "auto" and saved["model"].get("matmul") == "row_major":
        current["model"]["matmul"] = "row_major"
    for section in RESUME_FIXED:
        if saved.get(section) != current.get(section):
            diffs = _differences(saved.get(section), current.get(section), section)
            raise ValueError(
                f"{saved_path.parent} holds a run whose config differs in {', '.join(diffs)}; "
                "resume it with the same settings or start a new --workdir"
            )


def _differences(saved, current, prefix):
    if not isinstance(saved, dict) or not isinstance(current, dict):
        return [f"config.{prefix} ({saved!r} there, {current!r} now)"]
    keys = sorted(set(saved) | set(current))
    return [
        d
        for k in keys
        if saved.get(k) != current.get(k)
        for d in _differences(saved.get(k), current.get(k), f"{prefix}.{k}")
    ]


def model_config(
    config: ml_collections.ConfigDict, vocab_size: int, dtype: str | None = None, platform: str | None = None
) -> TransformerConfig:
    """The model config, its compute dtype and backend hooks picked for `platform` (so: after `distributed.initialize`).

    dtype: the run's resolved compute dtype (`precision.run_dtype`); None resolves `model.dtype` for
    `platform` (`precision.resolve`: 'auto' measures this machine, or is bfloat16 for a GPU/TPU target).
    platform: the JAX platform the program is compiled for ("cpu", "cuda", "tpu", ...); None: this
    process's default backend. A program compiled ahead of time for an accelerator on a CPU host names
    it, so none of XLA:CPU's hooks (`backends.model_hooks`) reach it.
    """
    dtype = dtype or precision.resolve(
        config.model.dtype,
        compile_cache.cache_dir(config.compilation_cache_dir),
        matmul=config.model.matmul,
        platform=platform,
    )
    hooks = backends.model_hooks(config.model.matmul, DTYPES[dtype], platform)  # dot_general, formulation, dropout_keep
    return dataclasses.replace(_model_fields(config, vocab_size, dtype), **hooks)


# `TransformerConfig` fields the run sets rather than `config.model`: the vocabulary's size, the tokenizer's ids,
# the compute dtype `model.dtype` resolves to, the parameters' dtype (float32) and the hooks `model.matmul` picks.
SET_BY_RUN = (
    "vocab_size",
    "pad_id",
    "eos_id",
    "bos_id",
    "dtype",
    "param_dtype",
    "dot_general",
    "formulation",
    "dropout_keep",
)
# `config.model` settings that are not `TransformerConfig` fields (the run resolves them into dtype and hooks).
RUN_SETTINGS = ("dtype", "matmul")


def model_field_names() -> tuple[str, ...]:
    """The `TransformerConfig` fields `config.model` sets, by the same names (every field but `SET_BY_RUN`)."""
    return tuple(f.name for f in dataclasses.fields(TransformerConfig) if f.name not in SET_BY_RUN)


def model_defaults() -> dict:
    """Each `model_field_names()` field's `TransformerConfig` default, as `config.model` writes it."""
    fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
    return {name: _as_text(name, fields[name].default) for name in model_field_names()}


def _model_fields(config: ml_collections.ConfigDict, vocab_size: int, dtype: str = "float32") -> TransformerConfig:
    """The model config with lax's matmuls; building it runs the model's checks without touching JAX's backend.

    `config.model` holds `TransformerConfig`'s fields by name (`model_field_names()`, a missing one takes
    its default) and the `RUN_SETTINGS`; a name that is neither raises ValueError naming it.
    """
    names = model_field_names()
    unknown = sorted(set(config.model) - set(names) - set(RUN_SETTINGS))
    if unknown:
        raise ValueError(
            f"config.model.{unknown[0]} = {config.model[unknown[0]]!r}: no such model field; expected one of "
            f"models.TransformerConfig's fields {names} or the run's settings {RUN_SETTINGS}"
        )
    values = {name: _from_text(name, config.model[name]) for name in names if name in config.model}
    return TransformerConfig(vocab_size=vocab_size, dtype=DTYPES[dtype], **values)


def parse_options(text: str) -> dict:
    """'key=value,...' -> {key: value}, each value read as an int, a float, true/false/none, else kept as text."""
    pairs = [p for p in (text or "").split(",") if p]
    if any("=" not in p for p in pairs):
        raise ValueError(f"config.model.attention_options = {text!r}; expected 'key=value' pairs separated by commas")
    return {key.strip(): _option_value(value.strip()) for key, value in (p.split("=", 1) for p in pairs)}


def _option_value(text):
    words = {"true": True, "false": False, "none": None}
    if text.lower() in words:
        return words[text.lower()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def format_options(options) -> str:
    """{key: value} -> 'key=value,...', the text `parse_options` reads back."""
    return ",".join(
        f"{key}={str(value).lower() if value is None or isinstance(value, bool) else value}"
        for key, value in options.items()
    )


# `config.model` fields written as text, read into the model's value by the first function and written back by
# the second.
AS_TEXT = {"attention_options": (parse_options, format_options)}


def _from_text(name: str, value):
    return AS_TEXT[name][0](value) if name in AS_TEXT else value


def _as_text(name: str, value):
    return AS_TEXT[name][1](value) if name in AS_TEXT else value


def build_model(
    config: ml_collections.ConfigDict, vocab, dtype: str | None = None, platform: str | None = None
) -> Transformer:
    """The model a run's config describes, sized to the vocabulary it trained (or loaded); dtype and platform as
    `model_config`'s."""
    return Transformer(model_config(config, vocab.vocab_size(), dtype, platform))


def check_max_len(config: ml_collections.ConfigDict) -> None:
    """A training run's rows fit the model: `model.max_len` >= the packed row length, else the largest bucket.

    Not part of `validate`: a config used with hand-made batches (tests, analyses) may hold a shorter max_len.
    """
    pack = config.data.get("pack_length", 0)
    longest = pack or max(config.data.bucket_lengths)
    _require(
        "model.max_len",
        config.model.max_len,
        isinstance(config.model.max_len, int) and config.model.max_len >= longest,
        f"an int >= {longest}, the longest training row "
        f"({'data.pack_length' if pack else 'the largest data.bucket_lengths'})",
    )


def _positive(value) -> bool:
    # finite too: an inf or nan peak learning rate would train to nan parameters, not fail here
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_knobs(config: ml_collections.ConfigDict) -> None:
    """The optimizer, data and eval numbers a run would otherwise accept and misuse (train uphill, at rate 0, ...)."""
    opt = config.optimizer
    _require(
        "optimizer.learning_rate",
        opt.learning_rate,
        _positive(opt.learning_rate),
        "a finite number > 0 (the schedule's peak)",
    )
    # rsqrt divides by the warm-up (0: a rate of 0 all run); cosine ramps over it (0: straight to the peak)
    least = 1 if opt.schedule == "rsqrt" else 0
    _require(
        "optimizer.warmup_steps",
        opt.warmup_steps,
        _count(opt.warmup_steps) and opt.warmup_steps >= least,
        f"an int >= {least}" + (" (the rsqrt schedule divides by it)" if least else ""),
    )
    for field in ("b1", "b2"):
        _require(
            f"optimizer.{field}", opt[field], isinstance(opt[field], (int, float)) and 0 <= opt[field] < 1, "in [0, 1)"
        )
    _require("optimizer.eps", opt.eps, isinstance(opt.eps, (int, float)) and opt.eps >= 0, ">= 0")
    _require(
        "optimizer.label_smoothing",
        opt.label_smoothing,
        isinstance(opt.label_smoothing, (int, float)) and 0 <= opt.label_smoothing < 1,
        "in [0, 1)",
    )
    _require(
        "optimizer.grad_clip_norm",
        opt.grad_clip_norm,
        isinstance(opt.grad_clip_norm, (int, float)) and opt.grad_clip_norm >= 0,
        ">= 0 (0: no clipping)",
    )
    _require("data.train_limit", config.data.train_limit, _count(config.data.train_limit), "an int >= 0 (0: all pairs)")
    _require(
        "data.vocab_size",
        config.data.vocab_size,
        isinstance(config.data.vocab_size, int) and config.data.vocab_size >= 8,
        "an int >= 8 (pad, eos, bos, unk and some pieces)",
    )
    _require(
        "data.token_budget",
        config.data.token_budget,
        _count(config.data.token_budget) and config.data.token_budget > 0,
        "a positive int",
    )
    pack = config.data.get("pack_length", 0)
    _require("data.pack_length", pack, _count(pack), "an int >= 0 (0: buckets)")
    _require(
        "eval.bleu_examples",
        config.eval.bleu_examples,
        _count(config.eval.bleu_examples),
        "an int >= 0 (0: the whole dev split)",
    )
    _require("eval.max_extra_length", config.eval.max_extra_length, _count(config.eval.max_extra_length), "an int >= 0")
    _require(
        "eval.alpha", config.eval.alpha, isinstance(config.eval.alpha, (int, float)) and config.eval.alpha >= 0, ">= 0"
    )
    factor = config.get("divergence_factor", 0.0)
    _require(
        "divergence_factor",
        factor,
        isinstance(factor, (int, float)) and (factor == 0 or factor > 1),
        "0 (stop on a non-finite loss only) or a number > 1",
    )


def _require(field, value, ok, expected):
    if not ok:
        raise ValueError(f"config.{field} = {value!r}; expected {expected}")
