"""The pre-registered, blocked replication of the head-size finding (results/preregistration.md).

The head-size sweep (configs/ablation_head_size.py) found rows A's loss at h = 32 going with its
smaller heads: d_k = d_v 32 -> 8 at h = 8 cost 1.47 BLEU. This sweep repeats its 2 x 2 on five
fresh seeds (10-14, which no earlier run used), all on one commit and one CPU kind, and adds a
point that splits the key size from the value size:

    shape          h    d_k   d_v   width q.k / v
    h8_dk32        8    32    32    256 / 256      the reference (rows A's h = 8 config)
    h8_dk8         8    8     8     64 / 64
    h32_dk8        32   8     8     256 / 256      (rows A's h = 32 config)
    h32_dk16       32   16    16    512 / 512
    h8_dk32_dv8    8    32    8     256 / 64       only the value heads smaller

Every point trains on the Table 3 preset (configs/table3_preset.py, length buckets as every
committed Table 3 point); nothing is shared with the other sweeps: each run here is new. The
comparisons and their test are fixed in results/preregistration.md (seed as block).

    python sweep.py run --config configs/head_size_blocked.py --workdir runs/head_size_blocked --seeds 5
"""

from configs import default, table3_preset

SWEEP_NAME = "head_size_blocked"
SWEEP_KEY = "shape"
SWEEP_TEST_SPLIT = "test_2016_flickr"
SWEEP_FIRST_SEED = 10  # seeds 10-14: fresh data orders and initialisations (the earlier sweeps used 0-4)
SHAPES = {  # (heads, d_k, d_v)
    "h8_dk32": (8, 32, 32),
    "h8_dk8": (8, 8, 8),
    "h32_dk8": (32, 8, 8),
    "h32_dk16": (32, 16, 16),
    "h8_dk32_dv8": (8, 32, 8),
}
SWEEP_VALUES = tuple(SHAPES)
SWEEP_REFERENCE = "h8_dk32"
SWEEP_VARIANTS = table3_preset.SWEEP_VARIANTS  # :packed, the packed preset (configs/table3_preset.py)
SWEEP_PREREGISTRATION = "results/preregistration.md"  # fixed before the first run: `python sweep.py registered`
SWEEP_CONTRASTS = (  # (label, from, to): the registered family, in results/preregistration.md's order
    ("smaller heads at a fixed count", "h8_dk32", "h8_dk8"),
    ("more heads at a fixed head size", "h8_dk8", "h32_dk8"),
    ("the paper's head size at h = 32", "h32_dk8", "h32_dk16"),
    ("smaller value heads alone", "h8_dk32", "h8_dk32_dv8"),
    ("smaller key heads alone", "h8_dk32_dv8", "h8_dk8"),
)


@table3_preset.takes_packed
def get_config(arg: str | None = None):
    heads, d_k, d_v = table3_preset.named_point(arg, SWEEP_KEY, SHAPES, SWEEP_REFERENCE, "configs/head_size_blocked.py")
    config = table3_preset.apply(default.get_config(f"h={heads}"))
    config.model.head_dim = d_k
    config.model.v_head_dim = d_v
    return config
