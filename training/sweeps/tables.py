"""Tables (markdown, CSV) and plots of a sweep, rebuilt from its finished points' result.json alone."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from training.sweeps import sweep  # noqa: E402

# Vaswani et al. 2017, Table 3 rows (A): WMT14 en-de newstest2013, Transformer-base, 100k steps.
PAPER_HEADS = {1: (5.29, 24.9), 4: (5.00, 25.5), 8: (4.92, 25.8), 16: (4.91, 25.8), 32: (5.01, 25.4)}

# (column title, result field, format); fields in SPREAD_FIELDS read "mean ± std" over seeds.
DEV = [("dev PPL", "dev_perplexity", "{:.2f}"), ("dev BLEU", "dev_bleu", "{:.2f}")]
TRAIN = [("train tokens/s", "train_tokens_per_s", "{:,.0f}"), ("train wall s", "train_seconds", "{:,.0f}")]
COLUMNS = {
    "heads": [("h", "num_heads", "{:d}"), ("d_k", "head_dim", "{:d}"), ("parameters", "parameters", "{:,d}"), *DEV,
              ("test BLEU", "test_bleu", "{:.2f}"), *TRAIN],
    "kv": [("h", "num_heads", "{:d}"), ("kv heads", "num_kv_heads", "{:d}"), ("d_k", "head_dim", "{:d}"),
           ("parameters", "parameters", "{:,d}"), *DEV, ("KV-cache bytes/token", "kv_cache_bytes_per_token", "{:,.0f}"),
           ("greedy tokens/s", "decode_tokens_per_s_beam1", "{:,.0f}"),
           ("beam-4 tokens/s", "decode_tokens_per_s_beam4", "{:,.0f}"), *TRAIN],
}
SPREAD_FIELDS = {"dev_perplexity", "dev_bleu", "test_bleu"}


def collect(workdir: Path, results_dir: Path) -> list[Path]:
    """Write RESULTS_DIR/NAME.{md,csv,png} for the sweep in `workdir`; return the paths written."""
    spec_path = workdir / sweep.SPEC_FILE
    if not spec_path.exists():
        raise FileNotFoundError(f"{spec_path} is missing: run sweep.py --config ... --workdir {workdir} first")
    spec = json.loads(spec_path.read_text())
    rows = aggregate(load_results(workdir, spec))
    if not rows:
        raise FileNotFoundError(f"no finished point in {workdir} (none has {sweep.RESULT_FILE})")
    results_dir.mkdir(parents=True, exist_ok=True)
    stem = results_dir / spec["name"]
    kind = "heads" if spec["key"] == "h" else "kv"
    paths = [stem.with_suffix(".md"), stem.with_suffix(".csv"), stem.with_suffix(".png")]
    paths[0].write_text(markdown(rows, kind))
    write_csv(rows, paths[1])
    plot(rows, kind, paths[2])
    return paths


def load_results(workdir: Path, spec: dict) -> list[dict]:
    results = []
    for value in spec["values"]:
        for seed in range(spec["seeds"]):
            path = workdir / sweep.Point(spec["key"], value, seed).name / sweep.RESULT_FILE
            if path.exists():
                results.append(json.loads(path.read_text()))
    return results


def aggregate(results: list[dict]) -> list[dict]:
    """One row per swept value: shared fields from its first seed, `_mean`/`_std` of every number."""
    rows = []
    for value in dict.fromkeys(r["value"] for r in results):
        runs = [r for r in results if r["value"] == value]
        row = dict(runs[0]) | {"seeds": len(runs)}
        for field, first in runs[0].items():
            if isinstance(first, float):
                values = [r[field] for r in runs]
                row[f"{field}_mean"] = statistics.fmean(values)
                row[f"{field}_std"] = statistics.stdev(values) if len(values) > 1 else float("nan")
        rows.append(row)
    return rows


def markdown(rows: list[dict], kind: str) -> str:
    columns = COLUMNS[kind]
    paper = kind == "heads"
    titles = [t for t, _, _ in columns] + (["paper dev PPL", "paper dev BLEU"] if paper else []) + ["seeds"]
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    for row in rows:
        cells = []
        for _, field, fmt in columns:
            if field in SPREAD_FIELDS:
                std = row[field + "_std"]  # nan with one seed
                cells.append(fmt.format(row[field + "_mean"]) + (f" ± {fmt.format(std)}" if math.isfinite(std) else ""))
            else:
                cells.append(fmt.format(row[field + "_mean"] if f"{field}_mean" in row else row[field]))
        if paper:
            cells += [f"{x}" for x in PAPER_HEADS.get(row["value"], ("–", "–"))]
        cells.append(str(row["seeds"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict], path: Path) -> None:
    fields = [k for k in rows[0] if k not in ("point", "seed", "bleu_signature")]
    fields += [k for row in rows for k in row if k not in fields and k not in ("point", "seed", "bleu_signature")]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(fields)), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict], kind: str, path: Path) -> None:
    """BLEU and perplexity against the swept value, mean ± std over seeds (the paper's on a twin axis)."""
    x = [row["value"] for row in rows]
    fig, axes = plt.subplots(1, 2 if kind == "heads" else 3, figsize=(10 if kind == "heads" else 15, 4))
    for ax, field, label, paper_index in ((axes[0], "dev_bleu", "dev BLEU", 1), (axes[1], "dev_perplexity", "dev perplexity", 0)):
        ax.errorbar(x, [r[field + "_mean"] for r in rows], yerr=[r[field + "_std"] for r in rows],
                    marker="o", capsize=4, label="headcount, Multi30k de→en (mean ± std)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(v) for v in x])
        ax.set_xlabel("heads h (d_k = d_model / h)" if kind == "heads" else "KV heads (h = 8)")
        ax.set_ylabel(label)
        if kind == "heads":
            twin = ax.twinx()
            hs = sorted(PAPER_HEADS)
            twin.plot(hs, [PAPER_HEADS[h][paper_index] for h in hs], "s--", color="tab:red", label="paper, WMT14 en→de")
            twin.set_ylabel(f"paper {label} (WMT14)", color="tab:red")
            handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
            ax.legend(handles=handles, fontsize=8, loc="best")
        else:
            ax.legend(fontsize=8, loc="best")
    if kind == "kv":
        ax = axes[2]
        for beam in (1, 4):
            ax.plot(x, [r[f"decode_tokens_per_s_beam{beam}_mean"] for r in rows], "o-", label=f"decode tokens/s, beam {beam}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(v) for v in x])
        ax.set_xlabel("KV heads (h = 8)")
        ax.set_ylabel("decode tokens/s")
        twin = ax.twinx()
        twin.plot(x, [r["kv_cache_bytes_per_token_mean"] for r in rows], "s--", color="tab:gray", label="KV-cache bytes/token")
        twin.set_ylabel("KV-cache bytes per token", color="tab:gray")
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
