"""Rows A's h = 8 against h = 32 on twice the preset's schedule: does the ranking survive a longer budget?

h = 32 took 1.28x h = 8's steps to a common dev loss (results/heads.md, "Dev curves": means over five
seeds, untested), so part of its loss at the preset's 4,000 steps (configs/table3_preset.py) may be
budget rather than head count. Here both train 8,000 steps with the same schedule shape (300 warm-up
steps, cosine to zero at the last step, as configs/ablation_family_long.py does) and everything else
of the preset:

    run          h    steps   same run as
    h8_4000      8    4,000   rows A's h = 8 (the reference)
    h32_4000     32   4,000   rows A's h = 32
    h8_8000      8    8,000   -
    h32_8000     32   8,000   -

h8_8000 against h32_8000 is rows A's comparison at the longer budget; h8_4000 against h8_8000 and
h32_4000 against h32_8000 are what the longer schedule bought each. Every run is scored at its
best-dev-loss checkpoint, so an 8,000-step run can be scored well before step 8,000 (the stored ones:
step 4,800, results/heads_budget.md).

    python train.py --config configs/ablation_heads_budget.py:run=h32_8000 --workdir runs/h32_8000
    python sweep.py run --config configs/ablation_heads_budget.py --workdir runs/heads_budget --seeds 2
"""

from configs import default, table3_preset

SWEEP_NAME = "heads_budget"
SWEEP_KEY = "run"
SWEEP_TEST_SPLIT = "test_2016_flickr"
RUNS = {"h8_4000": (8, 4000), "h32_4000": (32, 4000), "h8_8000": (8, 8000), "h32_8000": (32, 8000)}  # (heads, steps)
SWEEP_VALUES = tuple(RUNS)
SWEEP_REFERENCE = "h8_4000"
SWEEP_VARIANTS = table3_preset.SWEEP_VARIANTS  # :packed, the packed preset (configs/table3_preset.py)
# the 4,000-step runs are rows A's, config for config (tests/sweeps/test_sweep_config.py): their seeds are copied
SWEEP_SHARED = {"h8_4000": ("heads", 8), "h32_4000": ("heads", 32)}
SWEEP_CONTRASTS = (  # (label, from, to): results/heads_budget.md's comparisons besides each against the reference
    ("h = 32 against h = 8 at 4,000 steps (rows A)", "h8_4000", "h32_4000"),
    ("h = 32 against h = 8, 8,000-step schedule", "h8_8000", "h32_8000"),
    ("8,000-step schedule against 4,000 at h = 8", "h8_4000", "h8_8000"),
    ("8,000-step schedule against 4,000 at h = 32", "h32_4000", "h32_8000"),
)


@table3_preset.takes_packed
def get_config(arg: str | None = None):
    heads, steps = table3_preset.named_point(arg, SWEEP_KEY, RUNS, SWEEP_REFERENCE, "configs/ablation_heads_budget.py")
    config = table3_preset.apply(default.get_config(f"h={heads}"))
    return table3_preset.set_steps(config, steps)
