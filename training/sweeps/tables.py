"""Tables (markdown, CSV) and plots of a sweep, rebuilt from its committed files alone (training/sweeps/store.py)."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from training.sweeps import significance, store  # noqa: E402

# Vaswani et al. 2017, Table 3 rows (A): WMT14 en-de newstest2013, Transformer-base, 100k steps.
PAPER_HEADS = {1: (5.29, 24.9), 4: (5.00, 25.5), 8: (4.92, 25.8), 16: (4.91, 25.8), 32: (5.01, 25.4)}

# (column title, result field, format); fields in SPREAD_FIELDS read "mean ± sd" over seeds.
SCORES = [("dev PPL", "dev_perplexity", "{:.2f}"), ("dev BLEU", "dev_bleu", "{:.2f}"),
          ("test PPL", "test_perplexity", "{:.2f}"), ("test BLEU", "test_bleu", "{:.2f}")]
TRAIN = [("train tokens/s", "train_tokens_per_s", "{:,.0f}"), ("train wall s", "train_seconds", "{:,.0f}")]
HEADS = [("h", "num_heads", "{:d}"), ("d_k", "head_dim", "{:d}"), ("parameters", "parameters", "{:,d}"), *SCORES, *TRAIN]
COLUMNS = {  # by the sweep's key; any other key gets HEADS' columns
    "h": HEADS,
    "kv": [("h", "num_heads", "{:d}"), ("kv heads", "num_kv_heads", "{:d}"), ("d_k", "head_dim", "{:d}"),
           ("parameters", "parameters", "{:,d}"), *SCORES, ("KV-cache bytes/token", "kv_cache_bytes_per_token", "{:,.0f}"),
           ("greedy tokens/s", "decode_tokens_per_s_beam1", "{:,.0f}"),
           ("beam-4 tokens/s", "decode_tokens_per_s_beam4", "{:,.0f}"), *TRAIN],
    "dk": [("h", "num_heads", "{:d}"), ("d_k", "head_dim", "{:d}"), ("d_v", "v_head_dim", "{:d}"),
           ("parameters", "parameters", "{:,d}"), *SCORES, *TRAIN],
}
SPREAD_FIELDS = {"dev_perplexity", "dev_bleu", "test_perplexity", "test_bleu"}
X_LABELS = {"h": "heads h (d_k = d_v = d_model / h)", "kv": "KV heads (h = 8)", "dk": "query/key width d_k per head (h = 8, d_v fixed)"}


def collect(results_dir: Path, names: list[str] | None = None) -> list[Path]:
    """Write RESULTS_DIR/NAME.{md,csv,png} for every sweep stored under `results_dir` (or those in `names`)."""
    dirs = store.sweep_dirs(results_dir)
    if names is not None:
        dirs = [d for d in dirs if d.name in names]
        missing = sorted(set(names) - {d.name for d in dirs})
        if missing:
            raise FileNotFoundError(f"--results_dir {results_dir} holds no sweep {', '.join(missing)} (no NAME/{store.SPEC_FILE})")
    if not dirs:
        raise FileNotFoundError(f"--results_dir {results_dir} holds no sweep (no NAME/{store.SPEC_FILE})")
    paths = []
    for sweep_dir in dirs:
        paths += collect_one(sweep_dir, Path(results_dir))
    return paths


def collect_one(sweep_dir: Path, results_dir: Path) -> list[Path]:
    spec = store.read_spec(sweep_dir)
    results = store.load_results(sweep_dir, spec)
    if not results:
        raise FileNotFoundError(f"no finished point in {sweep_dir} (none has {store.RESULT_FILE})")
    rows = aggregate(results, significance.seed_pair_p_values(sweep_dir, spec, results))
    stem = results_dir / spec["name"]
    paths = [stem.with_suffix(".md"), stem.with_suffix(".csv"), stem.with_suffix(".png")]
    paths[0].write_text(markdown(rows, spec))
    write_csv(rows, paths[1])
    plot(rows, spec["key"], paths[2])
    return paths


def aggregate(results: list[dict], p_values: dict[int, list[float]] | None = None) -> list[dict]:
    """One row per swept value: shared fields from its first seed, `_mean`/`_std` of every number,
    `p_values` (against the reference point, seed pair by seed pair) where given."""
    rows = []
    for value in dict.fromkeys(r["value"] for r in results):
        runs = [r for r in results if r["value"] == value]
        row = dict(runs[0]) | {"seeds": len(runs)}
        for field, first in runs[0].items():
            if isinstance(first, float):
                values = [r[field] for r in runs]
                row[f"{field}_mean"] = statistics.fmean(values)
                row[f"{field}_std"] = statistics.stdev(values) if len(values) > 1 else float("nan")
        row["commits"] = ", ".join(dict.fromkeys(r["commit"][:10] + (" (dirty)" if r["dirty"] else "") for r in runs if "commit" in r)) or "–"
        if p_values and value in p_values:
            row["p_values"] = p_values[value]
        rows.append(row)
    return rows


def markdown(rows: list[dict], spec: dict) -> str:
    key, reference = spec["key"], spec["reference"]
    columns = [c for c in COLUMNS.get(key, HEADS) if any(c[1] in row or f"{c[1]}_mean" in row for row in rows)]
    paper = key == "h"
    p_title = f"test BLEU p vs {key}={reference} (paired bootstrap, per seed pair)"
    titles = [t for t, _, _ in columns] + (["paper dev PPL", "paper dev BLEU"] if paper else []) + [p_title, "seeds", "commits"]
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
        cells.append("reference" if row["value"] == reference else " / ".join(f"{p:.3f}" for p in row.get("p_values", [])) or "–")
        cells.append(str(row["seeds"]))
        cells.append(row["commits"])
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"\nMean ± sample sd over seeds. p: sacreBLEU's paired bootstrap ({significance.RESAMPLES} resamples) of test "
            f"BLEU, seed k of the point against seed k of {key}={reference}, one p per seed pair.\n")
    return "\n".join(lines) + "\n" + note


def write_csv(rows: list[dict], path: Path) -> None:
    skip = ("point", "seed", "bleu_signature", "commit", "dirty")
    fields = [k for row in rows for k in row if k not in skip]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(fields)), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict], key: str, path: Path) -> None:
    """BLEU and perplexity against the swept value, mean ± std over seeds (the paper's on a twin axis)."""
    x = [row["value"] for row in rows]
    panels = 3 if key == "kv" else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    for ax, field, label, paper_index in ((axes[0], "dev_bleu", "dev BLEU", 1), (axes[1], "dev_perplexity", "dev perplexity", 0)):
        ax.errorbar(x, [r[field + "_mean"] for r in rows], yerr=[r[field + "_std"] for r in rows],
                    marker="o", capsize=4, label="headcount, Multi30k de→en (mean ± std)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(v) for v in x])
        ax.set_xlabel(X_LABELS.get(key, key))
        ax.set_ylabel(label)
        if key == "h":
            twin = ax.twinx()
            hs = sorted(PAPER_HEADS)
            twin.plot(hs, [PAPER_HEADS[h][paper_index] for h in hs], "s--", color="tab:red", label="paper, WMT14 en→de")
            twin.set_ylabel(f"paper {label} (WMT14)", color="tab:red")
            handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
            ax.legend(handles=handles, fontsize=8, loc="best")
        else:
            ax.legend(fontsize=8, loc="best")
    if key == "kv":
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
