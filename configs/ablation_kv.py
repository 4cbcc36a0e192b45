"""KV-sharing ablation: MHA -> GQA -> MQA at h = 8 on the head sweep's CPU preset.

num_kv_heads takes h, h/2, h/4 and 1 with everything else (h, d_k, data, steps) fixed; only the
K/V projections and the decode cache shrink. One point is an ordinary config:

    python train.py --config configs/ablation_kv.py:kv=2 --workdir runs/kv2
    python sweep.py --config configs/ablation_kv.py --workdir runs/kv --seeds 2
"""

from configs import ablation_heads, default

SWEEP_NAME = "kv"  # results/kv.{md,csv,png}
SWEEP_KEY = "kv"
SWEEP_TEST_SPLIT = None  # dev split only: the KV table reports dev scores and decoding
SWEEP_VALUES = (8, 4, 2, 1)


def get_config(arg: str | None = None):
    config = default.get_config("h=8," + (arg or "kv=8"))
    ablation_heads.preset(config)
    return config
