"""Head-count ablation (Vaswani et al. 2017, Table 3 rows A) on Multi30k de->en, CPU preset.

d_model is fixed and d_k = d_v = d_model / h, so every point has the same attention compute and
parameter count; everything else equals across points. One point is an ordinary config:

    python train.py --config configs/ablation_heads.py:h=16 --workdir runs/h16
    python sweep.py --config configs/ablation_heads.py --workdir runs/heads --seeds 2

The preset (2+2 layers, width 256, MLP 1024, 8k vocabulary, 250 steps of 2048-token batches,
about 1.1 epochs) is sized so that the 12 runs of the sweep (6 points, 2 seeds, each trained and
evaluated with beam 4 on val and test) fit in two hours on one CPU core. Short of convergence by design:
it compares how well each head count learns under one fixed, small budget.
"""

from configs import default

SWEEP_NAME = "heads"  # results/heads.{md,csv,png}
SWEEP_KEY = "h"  # the config argument the sweep varies
SWEEP_TEST_SPLIT = "test_2016_flickr"  # also scored with beam 4
SWEEP_VALUES = (1, 2, 4, 8, 16, 32)


def get_config(arg: str | None = None):
    config = default.get_config(arg or "h=8")
    preset(config)
    return config


def preset(config):
    """The CPU preset shared by the head and KV sweeps."""
    config.model.num_layers = 2
    config.model.d_model = 256
    config.model.mlp_dim = 1024
    config.num_train_steps = 250
    config.optimizer.warmup_steps = 100
    config.eval_every_steps = 250  # one greedy dev evaluation, at the end (the sweep adds beam 4)
    config.checkpoint_every_steps = 50
    config.log_every_steps = 25
    config.eval.bleu_examples = 200
