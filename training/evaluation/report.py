"""Markdown summaries of a run's metrics.jsonl: `python -m training.evaluation.report runs/default`."""

from __future__ import annotations

import sys
from pathlib import Path

from training.core import files


def read_metrics(workdir: str | Path) -> tuple[list[dict], list[dict]]:
    """(training records, evaluation records) in file order."""
    records = files.read_jsonl(Path(workdir) / "metrics.jsonl")
    return [r for r in records if "split" not in r], [r for r in records if "split" in r]


def curve_table(workdir: str | Path) -> str:
    """One row per evaluation: dev loss, perplexity, greedy BLEU, and the training loss/speed then."""
    train, evals = read_metrics(workdir)
    lines = [
        "| step | dev loss | dev perplexity | dev BLEU (greedy) | train loss | target tokens/s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for e in evals:
        last = max((t for t in train if t["step"] <= e["step"]), key=lambda t: t["step"], default={})
        lines.append(
            f"| {e['step']} | {e['loss']:.3f} | {e['perplexity']:.2f} | {e['bleu']:.2f} "
            f"| {last.get('loss', float('nan')):.3f} | {last.get('tokens_per_s', float('nan')):,.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(curve_table(sys.argv[1]))
