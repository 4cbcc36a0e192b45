"""The attention family on Multi30k: each member at h = 8 on the Table 3 preset (configs/table3_preset.py).

`model.attention_type` takes every member with everything else (h = 8, d_k = 32, data, steps,
vocabulary) fixed, so the table shows the price of each approximation at translation lengths, not
its speed on long sequences (bench/attention_family.py measures that). The preset rather than
configs/default.py's own sizes: its points are trained to their plateau, and its softmax point is
rows A's h = 8 run, whose three seeds are shared, not trained again.

A member replaces attention where it can serve: bigbird and lsh in the encoder only (they do not
decode), linformer in the encoder and the cross-attention (it cannot be causal), span in the
self-attentions; performer, entmax and mla everywhere (models/transformer.py, `_attention`).

    python train.py --config configs/ablation_family.py:attention=performer --workdir runs/performer
    python sweep.py run --config configs/ablation_family.py --workdir runs/family --seeds 2
"""

from configs import default, table3_preset

SWEEP_NAME = "family"
SWEEP_KEY = "attention"
SWEEP_TEST_SPLIT = "test_2016_flickr"
SWEEP_VALUES = ("softmax", "bigbird", "lsh", "linformer", "performer", "entmax", "span", "mla")
SWEEP_REFERENCE = "softmax"
SWEEP_VARIANTS = table3_preset.SWEEP_VARIANTS  # :packed, the packed preset (configs/table3_preset.py)
SWEEP_SHARED_REFERENCE = ("heads", 8)  # softmax at h = 8 is rows A's h = 8 run, config for config

# Each member's settings at Multi30k's lengths (a sentence is ~15 tokens, a bucket at most 128), sized so
# that the approximation bites there: with the papers' long-sequence defaults (64-token blocks and
# chunks) bigbird equals softmax on a sentence (measured: 1e-6 apart) and lsh hashes it into one chunk.
OPTIONS = {
    "softmax": "",
    "bigbird": "block_size=2,window_blocks=1,global_blocks=1,random_blocks=1",  # 5 blocks: 10 keys a query
    "lsh": "num_buckets=4,chunk_length=4,num_hashes=2",  # a chunk of 4 and the one before: 8 keys a round
    # keys projected to 16 rows; max_length stays 256 = model.max_len, the longest input
    "linformer": "projected_length=16",
    "performer": "",  # m = round(d_k ln d_k) = 111 random features, the paper's choice
    "entmax": "",  # α starts at 1.5 in every head and is learned
    "span": "max_span=32,ramp=8",  # spans start at 32 and are learned
    "mla": "",  # d_c = 4 d_k = 128 a token, against 2 × 8 × 32 = 512 for MHA's K and V
}


@table3_preset.takes_packed
def get_config(arg: str | None = None):
    key, _, value = (arg or "attention=softmax").partition("=")
    if key != SWEEP_KEY or value not in OPTIONS:
        raise ValueError(f"configs/ablation_family.py takes attention=<one of {tuple(OPTIONS)}>, got {arg!r}")
    config = table3_preset.apply(default.get_config("h=8"))
    config.model.attention_type = value
    config.model.attention_options = OPTIONS[value]
    return config
