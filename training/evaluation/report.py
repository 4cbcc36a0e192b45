"""Markdown summaries of a run's metrics.jsonl: `python -m training.evaluation.report runs/default`."""

from __future__ import annotations

import sys
from pathlib import Path

from training.core import files
from training.core.markdown import markdown_table


def read_metrics(workdir: str | Path) -> tuple[list[dict], list[dict]]:
    """(training records, evaluation records) in file order."""
    records = files.read_jsonl(Path(workdir) / "metrics.jsonl")
    return [r for r in records if "split" not in r], [r for r in records if "split" in r]


def curve_table(workdir: str | Path) -> str:
    """One row per evaluation: dev loss, perplexity, greedy BLEU, and the training loss/speed then."""
    train, evals = read_metrics(workdir)
    rows = []
    for e in evals:
        last = max((t for t in train if t["step"] <= e["step"]), key=lambda t: t["step"], default={})
        then = [f"{last.get('loss', float('nan')):.3f}", f"{last.get('tokens_per_s', float('nan')):,.0f}"]
        rows.append([e["step"], f"{e['loss']:.3f}", f"{e['perplexity']:.2f}", f"{e['bleu']:.2f}", *then])
    titles = ["step", "dev loss", "dev perplexity", "dev BLEU (greedy)", "train loss", "target tokens/s"]
    return markdown_table(titles, rows, "rrrrrr")


if __name__ == "__main__":
    print(curve_table(sys.argv[1]))
