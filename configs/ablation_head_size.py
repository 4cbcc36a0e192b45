"""Head count against head size on the Table 3 preset (configs/table3_preset.py).

Rows A change two things at once: at d_model 256, h = 32 also means heads of d_k = d_v = 8 (the
paper's h = 32 has 16). This sweep crosses the two at h in {8, 32} and d_k = d_v in {8, 32 or 16},
letting the attention width h * d_k differ from d_model (the output projection maps it back):

    shape        h    d_k = d_v   width   same run as
    h8_dk32      8    32          256     rows A's h = 8 (the reference)
    h8_dk8       8    8           64      -
    h32_dk8      32   8           256     rows A's h = 32
    h32_dk16     32   16          512     -

h8_dk8 against h32_dk8 is "more heads" at a fixed head size; h8_dk8 against h8_dk32 is "smaller
heads" at a fixed count; h32_dk16 against h32_dk8 is the paper's head size at h = 32.

    python train.py --config configs/ablation_head_size.py:shape=h32_dk16 --workdir runs/h32_dk16
    python sweep.py run --config configs/ablation_head_size.py --workdir runs/head_size --seeds 3
"""

from configs import default, table3_preset

SWEEP_NAME = "head_size"
SWEEP_KEY = "shape"
SWEEP_TEST_SPLIT = "test_2016_flickr"
SHAPES = {"h8_dk32": (8, 32), "h8_dk8": (8, 8), "h32_dk8": (32, 8), "h32_dk16": (32, 16)}  # (heads, d_k = d_v)
SWEEP_VALUES = tuple(SHAPES)
SWEEP_REFERENCE = "h8_dk32"
SWEEP_VARIANTS = table3_preset.SWEEP_VARIANTS  # :packed, the packed preset (configs/table3_preset.py)
# h8_dk32 and h32_dk8 are rows A's h = 8 and h = 32, config for config (tests/sweeps/test_sweep_config.py):
# their seeds are copied
SWEEP_SHARED = {"h8_dk32": ("heads", 8), "h32_dk8": ("heads", 32)}
SWEEP_CONTRASTS = (  # (label, from, to): results/head_size.md's decomposition of rows A's h = 8 -> 32
    ("more heads at a fixed head size", "h8_dk8", "h32_dk8"),
    ("smaller heads at a fixed count", "h8_dk32", "h8_dk8"),
    ("the paper's head size at h = 32", "h32_dk8", "h32_dk16"),
)


@table3_preset.takes_packed
def get_config(arg: str | None = None):
    heads, width = table3_preset.named_point(arg, SWEEP_KEY, SHAPES, SWEEP_REFERENCE, "configs/ablation_head_size.py")
    config = table3_preset.apply(default.get_config(f"h={heads}"))
    config.model.head_dim = width
    config.model.v_head_dim = width
    return config
