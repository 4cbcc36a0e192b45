"""Transformer-base (Vaswani et al. 2017, Table 3 base row) on WMT14 en->de through tensorflow-datasets.

    pip install -e ".[wmt]"   # the tfds WMT builders need TensorFlow
    python train.py --config configs/base.py --workdir runs/base
    python eval.py --workdir runs/base --split test --beam_size 4      # newstest2014
    python train.py --config configs/base.py --workdir runs/base --config.mesh.data=-1   # all devices, data parallel

d_model 512, 6+6 layers, 8 heads, d_ff 2048, dropout 0.1, label smoothing 0.1, Adam (0.9, 0.98,
1e-9), peak lr (d_model * warmup)^-0.5 with 4000 warm-up steps, ~25k target tokens a batch,
post-LN as in the paper, 100k steps. A GPU/TPU-sized run, not a CPU one.
"""

from configs import default


def get_config(arg: str | None = None):
    config = default.get_config(arg)
    config.num_train_steps = 100_000
    config.log_every_steps = 100
    config.eval_every_steps = 5000
    config.checkpoint_every_steps = 2000
    config.data.update(
        dataset="wmt14_translate/de-en",
        dir="",
        src="en",
        tgt="de",
        train_split="train",
        eval_split="validation",
        vocab_size=32_000,
        token_budget=25_000,
        bucket_lengths=(16, 24, 32, 48, 64, 96, 128, 192, 256),
        pack_length=0,  # buckets up to 256 tokens: packing was measured on Multi30k only, where 64 holds every pair
    )
    config.model.update(d_model=512, num_heads=8, num_layers=6, mlp_dim=2048, dropout_rate=0.1, pre_ln=False)
    config.optimizer.update(learning_rate=(512 * 4000) ** -0.5, warmup_steps=4000, grad_clip_norm=0.0)
    config.eval.bleu_examples = 1000
    return default.apply_arguments(config, arg)  # h=, kv= over the fields above
