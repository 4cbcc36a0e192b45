"""The dev-curve section of a sweep's page: final dev loss, the late gain in perplexity, and the steps each
value took to reach a dev loss every run reaches.
"""

from __future__ import annotations

import statistics

from sweeps import curves
from sweeps.tables.prose import fill
from training.core.markdown import markdown_table


def curves_markdown(run_curves: list[tuple[int | str, curves.Curve]], spec: dict) -> str:
    """The dev-curve section: final dev loss, the last 20 % of steps' perplexity gain, steps to a common dev loss."""
    run_curves = [(value, curve) for value, curve in run_curves if len(curve) >= 2]
    if not run_curves:
        return ""
    key, reference = spec["key"], spec["reference"]
    target = max(curve[-1][1] for _, curve in run_curves)  # the worst run's final loss: every run reaches it
    per_value: dict[int, dict[str, list]] = {}
    for value, curve in run_curves:
        entry = per_value.setdefault(value, {"final": [], "tail": [], "steps": []})
        entry["final"].append(curve[-1][1])
        entry["tail"].append(curves.tail_improvement(curve))
        entry["steps"].append(curves.steps_to_loss(curve, target))
    mean = statistics.fmean
    spread = lambda xs, fmt: f" ± {statistics.stdev(xs):{fmt}}" if len(xs) > 1 else ""  # in its mean's format
    reference_steps = mean(per_value[reference]["steps"]) if reference in per_value else None
    titles = [key, "final dev loss", "dev PPL gain over the last 20 % of steps", f"steps to dev loss {target:.3f}"]
    titles += [f"÷ {key}={reference}'s", "runs"]
    rows = []
    for value, entry in per_value.items():
        steps = mean(entry["steps"])
        rows.append(
            [
                value,
                f"{mean(entry['final']):.3f}{spread(entry['final'], '.3f')}",
                f"{100 * mean(entry['tail']):.2f} %{spread([100 * t for t in entry['tail']], '.2f')}",
                f"{steps:,.0f}{spread(entry['steps'], ',.0f')}",
                f"{steps / reference_steps:.2f}" if reference_steps else "–",
                len(entry["final"]),
            ]
        )
    lines = [
        f"\n## Dev curves ({evaluation_cadence([curve for _, curve in run_curves])})\n",
        markdown_table(titles, rows, "lrrrrr"),
    ]
    lines.append(f"\n{fill('curves', target=f'{target:.3f}')}\n")
    return "\n".join(lines) + "\n"


def evaluation_cadence(run_curves: list[curves.Curve]) -> str:
    """How often the runs evaluated dev loss: "evaluated every 400 steps", or, where runs differ, each cadence
    with the length of the runs that used it ("evaluated every 400 steps (runs of 4,000 steps), every 800
    (runs of 8,000)"). A run's cadence is its first two evaluations' distance, its length its last one's step."""
    lengths: dict[int, set[int]] = {}
    for curve in run_curves:
        lengths.setdefault(curve[1][0] - curve[0][0], set()).add(curve[-1][0])
    if len(lengths) == 1:
        return f"evaluated every {next(iter(lengths)):,} steps"
    parts = [
        f"{every:,}"
        + (" steps" if i == 0 else "")
        + f" (runs of {' and '.join(f'{n:,}' for n in sorted(ends))}"
        + (" steps)" if i == 0 else ")")
        for i, (every, ends) in enumerate(sorted(lengths.items()))
    ]
    return "evaluated every " + ", every ".join(parts)
