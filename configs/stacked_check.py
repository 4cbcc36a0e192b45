"""The stacked-seed check (results/stacked.md): rows A's reference point (h = 8, the packed preset), its seeds
trained stacked (`sweep.py run --stack_seeds 3`) and alone, on one CPU core, for `STEPS` steps.

The preset's 4,000 steps take about 55 minutes a seed on a CPU without native bfloat16, so the check on such a
CPU trains `STEPS` (the schedule's cosine decay and the cadence of ten evaluations scaled to it); the same
config, with the same seeds, trains both sides:

    taskset -c 1 python sweep.py run --config configs/stacked_check.py --seeds 3 \
        --workdir runs/stacked_check/alone_runs --results_dir runs/stacked_check/alone
    taskset -c 1 python sweep.py run --config configs/stacked_check.py --seeds 3 --stack_seeds 3 \
        --workdir runs/stacked_check/stacked_runs --results_dir runs/stacked_check/stacked
    python -m bench.stacked_cpu --alone runs/stacked_check/alone --alone_runs runs/stacked_check/alone_runs \
        --stacked runs/stacked_check/stacked --stacked_runs runs/stacked_check/stacked_runs

(each run under `/usr/bin/time -v`, its report passed as --alone_time / --stacked_time: results/stacked.md).
"""

from configs import ablation_heads, table3_preset

SWEEP_NAME = "stacked_check"
SWEEP_KEY = "h"
SWEEP_TEST_SPLIT = "test_2016_flickr"
SWEEP_VALUES = (8,)
SWEEP_REFERENCE = 8
STEPS = 800


def get_config(arg: str | None = None):
    config = ablation_heads.get_config(f"{arg or 'h=8'},{table3_preset.PACKED}")
    return table3_preset.set_steps(config, STEPS)
