"""Head-count ablation (Vaswani et al. 2017, Table 3 rows A) on Multi30k de->en.

d_model is fixed and d_k = d_v = d_model / h, so every point has the same attention compute and
parameter count; everything else (configs/table3_preset.py) is equal across points. One point is
an ordinary config:

    python train.py --config configs/ablation_heads.py:h=16 --workdir runs/h16
    python sweep.py run --config configs/ablation_heads.py --workdir runs/heads --seeds 3
    python sweep.py run --config configs/ablation_heads.py:packed --workdir runs/heads_packed
        # the packed preset: results/heads_packed/
"""

from configs import default, table3_preset

SWEEP_NAME = "heads"  # results/heads.{md,csv,png}, points under results/heads/
SWEEP_KEY = "h"  # the config argument the sweep varies
SWEEP_TEST_SPLIT = "test_2016_flickr"  # also scored with beam 4; the paired bootstrap runs on it
SWEEP_VALUES = (1, 2, 4, 8, 16, 32)
SWEEP_REFERENCE = 8  # every point is compared with this one
SWEEP_VARIANTS = table3_preset.SWEEP_VARIANTS  # :packed, the packed preset (configs/table3_preset.py)


@table3_preset.takes_packed
def get_config(arg: str | None = None):
    return table3_preset.apply(default.get_config(arg or "h=8"))
