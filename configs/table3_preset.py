"""The one training preset shared by the Table 3 sweeps (configs/ablation_heads.py, ablation_kv.py, ablation_dk.py).

Every point of every sweep trains with these sizes, steps and schedule, so the swept field (and the
seed) is the only difference between points. The step count is chosen by measurement (the evidence
is in results/plateau/README.md and results/heads.md, "Dev curves"): at h = 8 the dev loss has
flattened (the last 20 % of steps improve dev perplexity by less than 2 %) and h = 4 and h = 8
reach 36 test sacreBLEU. The learning rate decays to zero at the last step (cosine), so a run of
this length ends annealed; batches of 1024 slots a side give twice the updates per second of
compute of 2048, which trained better in a fixed time (results/small_25min/README.md).

Every Table 3 sweep config also takes the packed variant (`pack`) as an item of its argument,
`takes_packed`: `python train.py --config configs/ablation_heads.py:h=8,packed` (`:packed` alone: the
reference point), and a whole sweep of it is `python sweep.py run --config configs/ablation_heads.py:packed`,
stored under its own name (results/heads_packed/: `SWEEP_VARIANTS`, sweeps/schema.py `load_module`).
"""

import functools

D_MODEL = 256  # d_model of every point: rows A split it over h heads, rows B fix d_v = D_MODEL / 8
PACK_LENGTH = 64  # the packed variant's row length (as configs/default.py packs): one training shape
EVAL_LENGTHS = (64,)  # the packed variant's fixed evaluation lengths (model.max_len added): Multi30k's dev set fits 64
PACKED = "packed"  # the config argument's item that selects `pack` (configs/ablation_heads.py:h=8,packed)
# what a Table 3 sweep config's SWEEP_VARIANTS names: `sweep.py run --config configs/ablation_heads.py:packed` runs
# every point with ",packed" added to its argument, stored as SWEEP_NAME + "_packed" (packed points compare with
# packed points only)
SWEEP_VARIANTS = (PACKED,)
NUM_TRAIN_STEPS = 4000  # see the docstring and results/plateau/ (about 7.6 epochs of Multi30k at 1024 slots a batch)

# Every comparison results/table3.md reads, as one study (`python sweep.py study --config configs/table3_preset.py`:
# one Holm family over all of them, beside each sweep's own): rows A and B and KV sharing against the
# reference, the head-size decomposition, and the budget's two comparisons rows A lacks. Head size's
# h8_dk32 -> h32_dk8 and the budget's h8_4000 -> h32_4000 are rows A's h = 8 -> 32 (the same runs), so
# they are left out rather than counted twice.
STUDY_NAME = "table3_study"
STUDY_TITLE = "Table 3 as one study"
STUDY = (
    *(("heads", 8, h) for h in (1, 2, 4, 16, 32)),
    ("dk", 32, 8),
    ("dk", 32, 16),
    *(("kv", 8, kv) for kv in (4, 2, 1)),
    ("head_size", "h8_dk32", "h8_dk8"),
    ("head_size", "h8_dk8", "h32_dk8"),
    ("head_size", "h32_dk8", "h32_dk16"),
    ("heads_budget", "h8_8000", "h32_8000"),
    ("heads_budget", "h8_4000", "h8_8000"),
    ("heads_budget", "h32_4000", "h32_8000"),
)


def apply(config, *, packed: bool = False):
    """Set the shared preset on `config` (a configs/default.py config) in place; `packed`: see `pack`."""
    config.model.num_layers = 2
    config.model.d_model = D_MODEL
    config.model.mlp_dim = 1024
    set_steps(config, NUM_TRAIN_STEPS)
    # pinned, not 'auto': every point computes in one dtype whichever machine runs it (on CPUs
    # without native bf16 it runs at the float32 rate; where native: results/small_25min/README.md)
    config.model.dtype = "bfloat16"
    # Every point multiplies bfloat16 operands into float32 sums, on every machine: on XLA:CPU that is the
    # row-major product `model.matmul = "auto"` takes for 16-bit compute (float32 results; without it, XLA:CPU's
    # bf16 products ran slower and strayed further from the other machines' training: results/plateau/README.md,
    # "Across machines"), on a GPU or TPU XLA's own dots, whose matrix units accumulate bf16 in float32. "auto"
    # picks each per target platform; the committed CPU points ran the same program under the earlier
    # pinned "row_major", which no GPU or TPU program should carry (results/peer_compiled.md).
    config.model.matmul = "auto"
    config.data.token_budget = 1024
    config.data.pack_length = 0  # length buckets: every committed point was trained so (the default packs since)
    config.optimizer.schedule = "cosine"
    config.optimizer.warmup_steps = 300
    config.log_every_steps = 50
    config.eval.bleu_examples = 200
    return pack(config) if packed else config


def pack(config):
    """The preset for new sweeps: packed training rows and evaluation at a few fixed lengths.

    The committed Table 3 points were trained with length buckets (`apply`'s default), which
    compile one training program per bucket shape and evaluation programs per bucket again; a
    point then spent most of its time compiling. Packed rows are one training shape, and dev
    batches and decoded sources are padded to `EVAL_LENGTHS` and the model's max_len, so a run
    compiles a handful of programs (bench/compile_count.py). Evaluation scores are those of the
    bucketed evaluation (the output cap stays the bucket's); training differs (packed rows), so
    packed points compare with packed points only.
    """
    config.data.pack_length = PACK_LENGTH
    config.eval.lengths = (*EVAL_LENGTHS, config.model.max_len)
    return config


def takes_packed(get_config):
    """A Table 3 sweep config's `get_config` that also takes `PACKED` as an item of its argument ("h=8,packed";
    "packed" alone: the config's reference point): the config the rest of the argument names, packed (`pack`)."""

    @functools.wraps(get_config)
    def get_config_or_packed(arg: str | None = None):
        items = (arg or "").split(",")
        config = get_config(",".join(i for i in items if i and i != PACKED) or None)
        return pack(config) if PACKED in items else config

    return get_config_or_packed


def set_steps(config, num_train_steps: int):
    """Set the step count with the cadence tied to it: ten dev evaluations (the curve behind the
    plateau and convergence claims) and ten checkpoints a run, whatever its length."""
    config.num_train_steps = num_train_steps
    config.eval_every_steps = num_train_steps // 10
    config.checkpoint_every_steps = num_train_steps // 10
    return config


def named_point(arg: str | None, key: str, points: dict, reference: str, path: str):
    """What a sweep config over named points maps its argument `KEY=NAME` to (`reference`'s when `arg` is None);
    a ValueError naming the config file and the names it takes otherwise."""
    given, _, name = (arg or f"{key}={reference}").partition("=")
    if given != key or name not in points:
        raise ValueError(f"{path} takes {key}=<one of {tuple(points)}>, got {arg!r}")
    return points[name]
