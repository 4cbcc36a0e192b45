"""Query/key-size ablation (Vaswani et al. 2017, Table 3 rows B) on the Table 3 preset.

At h = 8 the value width per head stays d_v = d_model / 8 and the query/key width d_k
(`model.head_dim`) shrinks to d_v / 2 and d_v / 4; the paper found that reducing d_k hurts.
Only the Q/K projections and the score computation shrink. One point is an ordinary config:

    python train.py --config configs/ablation_dk.py:dk=16 --workdir runs/dk16
    python sweep.py run --config configs/ablation_dk.py --workdir runs/dk --seeds 3
"""

from configs import default, table3_preset

D_V = table3_preset.D_MODEL // 8
SWEEP_NAME = "dk"  # results/dk.{md,csv,png}, points under results/dk/
SWEEP_KEY = "dk"
SWEEP_TEST_SPLIT = "test_2016_flickr"
SWEEP_VALUES = (D_V // 4, D_V // 2, D_V)
SWEEP_REFERENCE = D_V  # d_k = d_v: the h = 8 point of rows A
SWEEP_VARIANTS = table3_preset.SWEEP_VARIANTS  # :packed, the packed preset (configs/table3_preset.py)
# the reference is the same run as rows A's h = 8 (tests/sweeps/test_sweep_config.py): its seeds are copied,
# not retrained
SWEEP_SHARED_REFERENCE = ("heads", 8)


@table3_preset.takes_packed
def get_config(arg: str | None = None):
    key, _, value = (arg or f"dk={D_V}").partition("=")
    if key != "dk" or not value.isdigit() or int(value) < 1:
        raise ValueError(
            f"configs/ablation_dk.py takes the argument dk=<positive query/key width per head>, got {arg!r}"
        )
    config = table3_preset.apply(default.get_config("h=8"))
    config.model.head_dim = int(value)
    config.model.v_head_dim = D_V
    return config
