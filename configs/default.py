"""Multi30k de->en on CPU: 3+3 layers, width 256, 4 heads (d_k 64), MLP 1024, 8k joint vocabulary.

    python train.py --config configs/default.py --workdir runs/default
    python train.py --config configs/default.py:h=8,kv=2 --workdir runs/h8kv2   # sweep points
    python eval.py --workdir runs/default

`h` sets model.num_heads (head_dim follows d_model / h), `kv` sets model.num_kv_heads.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # parameters, dropout and batch order
    config.num_train_steps = 3500  # optimizer steps; how long they take here: results/default/README.md
    config.log_every_steps = 50  # training metrics to the log, metrics.jsonl and TensorBoard
    config.eval_every_steps = 500  # dev loss, perplexity and greedy BLEU
    config.checkpoint_every_steps = 500  # orbax checkpoint of the full train state
    config.max_train_seconds = 0.0  # wall-clock budget of one invocation (0: none); then evaluate, save, stop
    config.compilation_cache_dir = (
        "auto"  # JAX's persistent cache: 'auto' ($XDG_CACHE_HOME or ~/.cache)/headcount/jax, '' none, or a path
    )
    config.keep_checkpoints = 3  # latest checkpoints kept (the best by dev loss is kept apart)
    config.divergence_factor = (
        10.0  # stop when a step's loss > this x the lowest running train loss (0: only non-finite)
    )

    config.data = ml_collections.ConfigDict()
    config.data.dataset = "multi30k"  # 'multi30k' or a tfds name such as 'wmt14_translate/de-en'
    config.data.dir = ""  # '' -> $MULTI30K_DIR, else ~/.cache/headcount/multi30k (tfds: its data_dir)
    config.data.src = "de"  # source language
    config.data.tgt = "en"  # target language
    config.data.train_split = "train"
    config.data.train_limit = 0  # use only the first N training pairs (0: all); for smoke tests
    config.data.eval_split = "val"  # dev set for periodic evaluation and best checkpoint
    config.data.vocab_size = 8000  # joint SentencePiece unigram vocabulary
    config.data.token_budget = 2048  # padded slots per side a batch: rows = budget // bucket length
    config.data.bucket_lengths = (8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)  # tokens, incl. BOS/EOS
    # pairs packed into rows of N tokens (one compiled shape; 0: batches of one bucket length). 64 measured
    # faster than the buckets in float32 on both CPUs tried and no worse per target token seen (results/peer.md)
    config.data.pack_length = 64

    config.model = ml_collections.ConfigDict()
    config.model.d_model = 256
    config.model.num_heads = 4
    config.model.num_kv_heads = ml_collections.FieldReference(None, field_type=int)  # None: = num_heads
    config.model.head_dim = ml_collections.FieldReference(None, field_type=int)  # None: d_model // num_heads
    config.model.v_head_dim = ml_collections.FieldReference(
        None, field_type=int
    )  # value width per head (None: head_dim)
    config.model.num_layers = 3  # encoder layers, and again decoder layers
    config.model.mlp_dim = 1024
    config.model.dropout_rate = 0.1
    config.model.attention_dropout_rate = 0.0
    config.model.pre_ln = True  # False: post-LN as in Vaswani et al.
    config.model.activation = "relu"  # or 'gelu'
    config.model.tie_embeddings = True
    config.model.scale_out_init = False  # W^O init / sqrt(2 num_layers)
    config.model.attention_bias = True  # biases on the attention's q/k/v/out projections
    config.model.max_len = 256
    # compute dtype: 'float32', 'bfloat16' (params stay float32), 'auto': bfloat16 where it measured faster
    # (training/core/precision.py)
    config.model.dtype = "auto"
    config.model.attention_impl = "vmap"
    config.model.attention_type = (
        "softmax"  # or a member of attention.family.ATTENTION_TYPES: linformer, performer, entmax, span, mla, ...
    )
    config.model.attention_options = (
        ""  # the member's settings as 'key=value,...', e.g. 'projected_length=32' (attention.family.options_of)
    )
    config.model.matmul = (
        "auto"  # 'xla', 'row_major' (backends/xla_cpu_bf16.py), 'auto': row_major on XLA:CPU, xla elsewhere
    )

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.schedule = (
        "rsqrt"  # 'rsqrt': Vaswani's inverse square root; 'cosine': warm-up, then cosine to 0 at num_train_steps
    )
    config.optimizer.learning_rate = 2e-3  # peak of the schedule
    config.optimizer.warmup_steps = 500
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.98
    config.optimizer.eps = 1e-9
    config.optimizer.label_smoothing = 0.1
    config.optimizer.grad_clip_norm = 1.0  # 0 disables clipping

    config.eval = ml_collections.ConfigDict()
    config.eval.bleu_examples = 500  # dev sentences translated for the periodic BLEU (0: all)
    config.eval.alpha = 0.6  # length penalty exponent
    config.eval.max_extra_length = 50  # output length limit = source length + this
    # fixed lengths dev batches and decoded sources are padded to, one compile each (): the buckets
    config.eval.lengths = ()

    config.parallelism = "jit"  # 'jit': the step jitted over the mesh below; 'pmap': data parallel over local devices
    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = 1  # batch shards (-1: the devices left over by mesh.model)
    config.mesh.model = 1  # head / MLP-hidden shards, Megatron-style (-1: the devices left over by mesh.data)
    config.mesh.shard_embeddings = False  # split the embedding table over `model` by vocabulary (else replicated)

    config.distributed = ml_collections.ConfigDict()
    config.distributed.initialize = (
        "auto"  # jax.distributed: 'auto' (coordinator set, or a SLURM job of >1 task), 'always' (TPU pods), 'never'
    )
    config.distributed.coordinator_address = (
        ""  # 'host:port' of process 0 ('': $JAX_COORDINATOR_ADDRESS or JAX's detection)
    )
    config.distributed.num_processes = 0  # 0: from the environment (SLURM, Cloud TPU)
    config.distributed.process_id = -1  # -1: from the environment

    return apply_arguments(config, arg)


def apply_arguments(config: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
    """Set the fields the config argument names (`ARGUMENTS`) on `config`: a config built on this one (base.py,
    big.py) applies them after its own fields, so that `configs/base.py:h=16` trains 16 heads."""
    for key, value in _parse(arg).items():
        if key not in ARGUMENTS:
            raise ValueError(f"configs/default.py:{arg}: unknown argument {key!r}; expected h=<heads>,kv=<kv heads>")
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"configs/default.py:{arg}: {key} ({ARGUMENTS[key]}) = {value!r}; expected a positive int")
        section, field = ARGUMENTS[key].split(".")
        config[section][field] = int(value)
    return config


ARGUMENTS = {"h": "model.num_heads", "kv": "model.num_kv_heads"}  # the config file's arguments and the fields they set


def _parse(arg):
    pairs = [p for p in (arg or "").split(",") if p]
    if any("=" not in p for p in pairs):
        raise ValueError(f"configs/default.py:{arg}: expected key=value pairs separated by commas, such as h=8,kv=2")
    return dict(p.split("=", 1) for p in pairs)
