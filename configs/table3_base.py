"""Table 3 rows A at the paper's scale: Transformer-base on WMT14 en->de, h = 1, 4, 8, 16, 32, d_k = d_v = 512 / h.

Every point is configs/base.py (post-LN base, 100k steps, ~25k tokens a side a batch, dev on newstest2013
as the paper's Table 3) with its head count; each point uses every chip of its host as one data-parallel
mesh (mesh.data = -1), and the points run one after another. From the data to the sweep (docs/sweeps.md,
"Table 3 at the paper's scale"):

    python prepare.py --config configs/table3_base.py --vocab_seed 0   # once: vocabulary + arrays
    python sweep.py plan --config configs/table3_base.py --target tpu:v5e:2x4          # compiled, nothing trained
    python sweep.py run --config configs/table3_base.py --workdir runs/table3_base --seeds 3
"""

from configs import base

SWEEP_NAME = "table3_base"  # results/table3_base.{md,csv,png}, points under results/table3_base/
SWEEP_KEY = "h"
SWEEP_TEST_SPLIT = "test"  # newstest2014, scored with beam 4 besides the dev split (newstest2013)
SWEEP_VALUES = (1, 4, 8, 16, 32)  # the paper's rows A
SWEEP_REFERENCE = 8


def get_config(arg: str | None = None):
    config = base.get_config(arg or "h=8")
    config.mesh.data = -1  # all of the host's chips, data parallel: one point at a time fills a TPU host
    return config
