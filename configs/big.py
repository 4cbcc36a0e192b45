"""Transformer-big (Vaswani et al. 2017) on WMT14 en->de: d_model 1024, 16 heads, d_ff 4096, dropout 0.3.

    python train.py --config configs/big.py --workdir runs/big
    python train.py --config configs/big.py --workdir runs/big --config.mesh.data=-1 --config.mesh.model=4
        # heads over 4 devices

Multi-host (TPU pod slice, SLURM): the same command on every process, see docs/distributed.md.
"""

from configs import base, default


def get_config(arg: str | None = None):
    config = base.get_config(arg)
    config.num_train_steps = 300_000
    config.model.update(d_model=1024, num_heads=16, mlp_dim=4096, dropout_rate=0.3)
    config.optimizer.learning_rate = (1024 * 4000) ** -0.5
    return default.apply_arguments(config, arg)  # h=, kv= over the fields above
