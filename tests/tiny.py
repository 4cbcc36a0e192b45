"""The tests' tiny models, written once: a `TransformerConfig` and a configs/default.py run on a Multi30k slice.

The suite's time is compiling; these sizes keep each program small. A test states only what it needs
beyond them, as overrides, so a reader sees which sizes its assertions depend on:

    tiny.model_config(num_kv_heads=2)                       # models.TransformerConfig
    tiny.train_config(10)                                   # configs/default.py, 10 steps, as a ConfigDict
    tiny.train_flags(60, **{"optimizer.learning_rate": 300.0})  # the same run as train.py's flags

tests/sweeps/tiny_sweep.py is the sweep's own copy of the run's sizes: sweep.py loads it by path in
subprocesses, where this module is not importable.
"""

from configs import default
from models import TransformerConfig

# d_model 32 in 4 heads of 8 (GQA and MQA have divisors to pick), 2 layers (a decoder cache with more than one
# layer), vocabulary 20 above the special ids, no dropout (deterministic outputs to compare).
MODEL = dict(vocab_size=20, d_model=32, num_heads=4, num_layers=2, mlp_dim=48, max_len=16, dropout_rate=0.0)

# train.py's loop on the first 300 Multi30k pairs: logs at 5, 10, ...; dev evaluations and checkpoints at 10, 20.
# max_len = the only bucket: dev pairs are cut to it, so the dev set is one batch shape (one compile).
# float32: the reference the bfloat16 test compares with ('auto' is test_precision.py's).
TRAIN = {
    "num_train_steps": 20,
    "log_every_steps": 5,
    "eval_every_steps": 10,
    "checkpoint_every_steps": 10,
    "data.train_limit": 300,
    "data.vocab_size": 300,
    "data.token_budget": 512,
    "data.bucket_lengths": (64,),
    "model.d_model": 16,
    "model.num_heads": 2,
    "model.num_layers": 1,
    "model.mlp_dim": 32,
    "model.max_len": 64,
    "model.dtype": "float32",
    "eval.bleu_examples": 8,
    "eval.max_extra_length": 5,
}


def model_config(**overrides) -> TransformerConfig:
    """`MODEL` with `overrides` (any `TransformerConfig` field)."""
    return TransformerConfig(**{**MODEL, **overrides})


def train_fields(steps: int = 20, **overrides) -> dict:
    """`TRAIN` at `steps` training steps with `overrides`, keyed by dotted config path ("model.max_len")."""
    return {**TRAIN, "num_train_steps": steps, **overrides}


def train_config(steps: int = 20, **overrides):
    """configs/default.py's config (a ConfigDict) with `train_fields(steps, **overrides)` set."""
    config = default.get_config()
    for path, value in train_fields(steps, **overrides).items():
        *sections, name = path.split(".")
        node = config
        for section in sections:
            node = node[section]
        node[name] = value
    return config


def train_flags(steps: int = 20, **overrides) -> list[str]:
    """train.py's `--config` flags for `train_config(steps, **overrides)`."""
    config_file = default.__file__
    return [f"--config={config_file}", *(f"--config.{k}={v}" for k, v in train_fields(steps, **overrides).items())]
