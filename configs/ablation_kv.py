"""KV-sharing ablation: MHA -> GQA -> MQA at h = 8 on the Table 3 preset (configs/table3_preset.py).

num_kv_heads takes h, h/2, h/4 and 1 with everything else (h, d_k, data, steps) fixed; only the
K/V projections and the decode cache shrink. One point is an ordinary config:

    python train.py --config configs/ablation_kv.py:kv=2 --workdir runs/kv2
    python sweep.py run --config configs/ablation_kv.py --workdir runs/kv --seeds 3
"""

from configs import default, table3_preset

SWEEP_NAME = "kv"  # results/kv.{md,csv,png}, points under results/kv/
SWEEP_KEY = "kv"
SWEEP_TEST_SPLIT = "test_2016_flickr"
SWEEP_VALUES = (8, 4, 2, 1)
SWEEP_REFERENCE = 8
SWEEP_VARIANTS = table3_preset.SWEEP_VARIANTS  # :packed, the packed preset (configs/table3_preset.py)
# the reference is the same run as rows A's h = 8 (tests/sweeps/test_sweep_config.py): its seeds are copied,
# not retrained
SWEEP_SHARED_REFERENCE = ("heads", 8)


@table3_preset.takes_packed
def get_config(arg: str | None = None):
    return table3_preset.apply(default.get_config("h=8," + (arg or "kv=8")))
