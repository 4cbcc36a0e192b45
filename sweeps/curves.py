"""Dev curves of a sweep's points, from their committed metrics.jsonl: the plateau check and steps to a dev loss.

Every point logs dev loss and perplexity at the same steps (the preset's eval_every_steps), so the
curves compare step for step. Two readings of them:

- plateau: by how much dev perplexity fell over the last `tail` of the steps, relative to where
  it stood (the preset is long enough when this is under 2 % at the reference point);
- steps to a target dev loss, linearly interpolated between evaluations (None if never reached):
  how fast a point converges, compared at one loss that every point reaches.
"""

from __future__ import annotations

from pathlib import Path

from training.core import files
from sweeps import store

Curve = list[tuple[int, float, float]]  # (step, dev loss, dev perplexity), by step


def dev_curve(records: list[dict], split: str) -> Curve:
    """The dev evaluations in a run's metrics records (those of `split`), one per step (a resumed run's last)."""
    by_step = {
        r["step"]: (r["loss"], r["perplexity"]) for r in records if r.get("split") == split and "perplexity" in r
    }
    return [(step, *by_step[step]) for step in sorted(by_step)]


def point_curve(sweep_dir: Path, spec: dict, result: dict, split: str) -> Curve:
    path = store.point_path(sweep_dir, spec["key"], result["value"], result["seed"]) / "metrics.jsonl"
    return dev_curve(files.read_jsonl(path), split) if path.exists() else []


def tail_improvement(curve: Curve, tail: float = 0.2) -> float:
    """(ppl at the last evaluation at or before step (1 - tail) * last step - final ppl) / that ppl."""
    if not 0 < tail < 1:
        raise ValueError(f"tail must be in (0, 1), got {tail}")
    if len(curve) < 2:
        raise ValueError(f"a plateau needs at least two dev evaluations, got {len(curve)}")
    last_step, _, final = curve[-1]
    earlier = [ppl for step, _, ppl in curve if step <= (1 - tail) * last_step]
    if not earlier:
        raise ValueError(f"no dev evaluation at or before step {(1 - tail) * last_step:g} of {last_step}")
    return (earlier[-1] - final) / earlier[-1]


def steps_to_loss(curve: Curve, target: float) -> float | None:
    """The first step at which dev loss reaches `target`, interpolated linearly between evaluations."""
    previous = None
    for step, loss, _ in curve:
        if loss <= target:
            if previous is None:
                return float(step)
            (step0, loss0) = previous
            return step0 + (step - step0) * (loss0 - target) / (loss0 - loss)
        previous = (step, loss)
    return None
