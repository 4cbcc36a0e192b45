"""The means over seeds: one row per swept value (the fields its seeds agree on, each number's mean and
spread, the per-seed columns), written as the markdown table of means and as the CSV.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from sweeps import significance
from sweeps.tables.batches import machine_label
from sweeps.tables.cells import pair_p
from sweeps.tables.paper import paper_numbers
from sweeps.tables.prose import fill
from training.core.markdown import markdown_table

# (column title, result field, format); fields in SPREAD_FIELDS read "mean ± sd" over seeds.
SCORES = [
    ("dev PPL", "dev_perplexity", "{:.2f}"),
    ("dev BLEU", "dev_bleu", "{:.2f}"),
    ("test PPL", "test_perplexity", "{:.2f}"),
    ("test BLEU", "test_bleu", "{:.2f}"),
]
TRAIN = [("train tokens/s", "train_tokens_per_s", "{:,.0f}"), ("train wall s", "train_seconds", "{:,.0f}")]
HEADS = [
    ("h", "num_heads", "{:d}"),
    ("d_k", "head_dim", "{:d}"),
    ("parameters", "parameters", "{:,d}"),
    *SCORES,
    *TRAIN,
]
COLUMNS = {  # by the sweep's key; any other key gets HEADS' columns
    "h": HEADS,
    "kv": [
        ("h", "num_heads", "{:d}"),
        ("kv heads", "num_kv_heads", "{:d}"),
        ("d_k", "head_dim", "{:d}"),
        ("parameters", "parameters", "{:,d}"),
        *SCORES,
        ("KV-cache bytes/token", "kv_cache_bytes_per_token", "{:,.0f}"),
        ("greedy tokens/s", "decode_tokens_per_s_beam1", "{:,.0f}"),
        ("beam-4 tokens/s", "decode_tokens_per_s_beam4", "{:,.0f}"),
        *TRAIN,
    ],
    "dk": [
        ("h", "num_heads", "{:d}"),
        ("d_k", "head_dim", "{:d}"),
        ("d_v", "v_head_dim", "{:d}"),
        ("parameters", "parameters", "{:,d}"),
        *SCORES,
        *TRAIN,
    ],
    "attention": [
        ("attention_type", "value", "{}"),
        ("parameters", "parameters", "{:,d}"),
        *SCORES,
        ("KV-cache bytes/token", "kv_cache_bytes_per_token", "{:,.0f}"),
        ("greedy tokens/s", "decode_tokens_per_s_beam1", "{:,.0f}"),
        ("beam-4 tokens/s", "decode_tokens_per_s_beam4", "{:,.0f}"),
        *TRAIN,
    ],
}
SPREAD_FIELDS = {"dev_perplexity", "dev_bleu", "test_perplexity", "test_bleu"}


PER_SEED_FIELDS = (
    "step",
    "dev_bleu",
    "test_bleu",
    "dev_perplexity",
    "test_perplexity",
)  # labelled per-seed CSV columns


def aggregate(results: list[dict], p_values: dict | None = None) -> list[dict]:
    """One row per swept value: the fields every seed agrees on, `_mean`/`_std` of every number, per-seed
    columns (`test_bleu_seed1`, `step_seed1`, ...; `p_seed1` where a per-pair p is given), and `p_values`
    (against the reference point, seed pair by seed pair: a list, or {seed: p})."""
    rows = []
    for value in dict.fromkeys(r["value"] for r in results):
        runs = sorted((r for r in results if r["value"] == value), key=lambda r: r.get("seed", 0))
        # a field whose seeds differ (step, test_bleu, seed) is never shown as one value: it would be seed 0's;
        # the per-seed fields are only per seed, even where the seeds agree
        row = {k: v for k, v in runs[0].items() if k not in PER_SEED_FIELDS and all(r.get(k) == v for r in runs)}
        row |= {"value": value, "seeds": len(runs)}
        for field, first in runs[0].items():
            if isinstance(first, float):
                values = [r[field] for r in runs]
                row[f"{field}_mean"] = statistics.fmean(values)
                row[f"{field}_std"] = statistics.stdev(values) if len(values) > 1 else float("nan")
        for field in PER_SEED_FIELDS:
            for r in runs:
                if field in r and "seed" in r:
                    row[f"{field}_seed{r['seed']}"] = r[field]
        row["commits"] = (
            ", ".join(
                dict.fromkeys(
                    r["commit"][:10]
                    + (" (dirty)" if r["dirty"] else "")
                    + (f" (run of {r['shared_from'].rsplit('/', 1)[0]})" if "shared_from" in r else "")
                    for r in runs
                    if "commit" in r
                )
            )
            or "–"
        )
        row["machines"] = machines(runs)
        if p_values and value in p_values:
            given = p_values[value]
            row["p_values"] = list(given.values()) if isinstance(given, dict) else list(given)
            if isinstance(given, dict):
                row.update({f"p_seed{seed}": p for seed, p in given.items()})
        rows.append(row)
    return rows


def machines(runs: list[dict]) -> str:
    """Which machines evaluated a row's runs, with counts ("AMD EPYC × 2, unrecorded × 1"): its speed
    columns average over them, and speeds compare only within one machine."""
    labels = [machine_label(r.get("machine")) for r in runs]
    return ", ".join(f"{label} × {labels.count(label)}" for label in dict.fromkeys(labels))


def markdown(rows: list[dict], spec: dict) -> str:
    key, reference = spec["key"], spec["reference"]
    columns = [c for c in COLUMNS.get(key, HEADS) if any(c[1] in row or f"{c[1]}_mean" in row for row in rows)]
    paper = key in ("h", "dk")
    p_title = f"per seed pair: test BLEU p vs {key}={reference}'s same seed (secondary; two-sided paired randomization)"
    titles = (
        [t for t, _, _ in columns]
        + (["paper dev PPL", "paper dev BLEU"] if paper else [])
        + [p_title, "seeds", "commits", "machines"]
    )
    table = []
    for row in rows:
        cells = []
        for _, field, fmt in columns:
            if field in SPREAD_FIELDS:
                std = row[field + "_std"]  # nan with one seed
                cells.append(fmt.format(row[field + "_mean"]) + (f" ± {fmt.format(std)}" if math.isfinite(std) else ""))
            else:
                cells.append(fmt.format(row[field + "_mean"] if f"{field}_mean" in row else row[field]))
        if paper:
            cells += [f"{x}" for x in paper_numbers(key, row) or ("–", "–")]
        cells.append(
            "reference" if row["value"] == reference else " / ".join(pair_p(p) for p in row.get("p_values", [])) or "–"
        )
        cells.append(str(row["seeds"]))
        cells.append(row["commits"])
        cells.append(row["machines"])
        table.append(cells)
    note = fill("means", trials=f"{significance.AR_TRIALS:,}", key=key, reference=reference)
    return f"{markdown_table(titles, table)}\n\n{note}\n"


def write_csv(rows: list[dict], path: Path) -> None:
    skip = ("point", "seed", "bleu_signature", "commit", "dirty", "machine", "p_values")
    fields = [k for row in rows for k in row if k not in skip]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(fields)), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
