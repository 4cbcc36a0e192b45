"""Tables (markdown, CSV) and plots of a sweep, rebuilt from its committed files alone (sweeps/store.py)."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from sweeps import curves, significance, store  # noqa: E402

# Vaswani et al. 2017, Table 3 rows (A): WMT14 en-de newstest2013, Transformer-base, 100k steps.
PAPER_HEADS = {1: (5.29, 24.9), 4: (5.00, 25.5), 8: (4.92, 25.8), 16: (4.91, 25.8), 32: (5.01, 25.4)}
# Rows (B), h = 8 and d_v = 64, by d_k / d_v (16, 32, and the base model's 64): (dev PPL, dev BLEU).
PAPER_DK_RATIO = {0.25: (5.16, 25.1), 0.5: (5.01, 25.4), 1.0: (4.92, 25.8)}


def paper_numbers(key: str, row: dict) -> tuple[float, float] | None:
    """The paper's (dev PPL, dev BLEU) for a row of the h or dk sweep (dk: matched by d_k / d_v), else None."""
    if key == "h":
        return PAPER_HEADS.get(row["value"])
    if key == "dk":
        return PAPER_DK_RATIO.get(row["head_dim"] / row["v_head_dim"])
    return None

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
    "attention": [("attention_type", "value", "{}"), ("parameters", "parameters", "{:,d}"), *SCORES,
                  ("KV-cache bytes/token", "kv_cache_bytes_per_token", "{:,.0f}"),
                  ("greedy tokens/s", "decode_tokens_per_s_beam1", "{:,.0f}"),
                  ("beam-4 tokens/s", "decode_tokens_per_s_beam4", "{:,.0f}"), *TRAIN],
}
SPREAD_FIELDS = {"dev_perplexity", "dev_bleu", "test_perplexity", "test_bleu"}
X_LABELS = {"h": "heads h (d_k = d_v = d_model / h)", "kv": "KV heads (h = 8)", "dk": "query/key width d_k per head (h = 8, d_v fixed)",
            "attention": "attention_type (h = 8)"}
DECODE_PANEL = ("kv", "attention")  # sweeps whose plot adds decode speed and cache size


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
    split = json.loads((store.point_path(sweep_dir, spec["key"], results[0]["value"], results[0]["seed"]) / "config.json").read_text())["data"]["eval_split"]
    run_curves = [(r["value"], curves.point_curve(sweep_dir, spec, r, split)) for r in results]
    paths[0].write_text(markdown(rows, spec) + reading_markdown(rows, spec) + curves_markdown(run_curves, spec))
    write_csv(rows, paths[1])
    plot(rows, spec["key"], paths[2])
    if any(curve for _, curve in run_curves):
        paths.append(stem.parent / f"{spec['name']}_curves.png")
        plot_curves(run_curves, spec["key"], paths[-1])
    return paths


def aggregate(results: list[dict], p_values: dict[int | str, list[float]] | None = None) -> list[dict]:
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
        row["commits"] = ", ".join(dict.fromkeys(
            r["commit"][:10] + (" (dirty)" if r["dirty"] else "") + (f" (run of {r['shared_from'].rsplit('/', 1)[0]})" if "shared_from" in r else "")
            for r in runs if "commit" in r)) or "–"
        row["machines"] = machines(runs)
        if p_values and value in p_values:
            row["p_values"] = p_values[value]
        rows.append(row)
    return rows


def machines(runs: list[dict]) -> str:
    """Which machines evaluated a row's runs, with counts ("AMD EPYC × 2, unrecorded × 1"): its speed
    columns average over them, and speeds compare only within one machine."""
    labels = [machine_label(r.get("machine")) for r in runs]
    return ", ".join(f"{label} × {labels.count(label)}" for label in dict.fromkeys(labels))


def machine_label(key: str | None) -> str:
    """A result's `machine` (precision.machine_key: "cpu|cpu|MODEL, BF16|jax ..|jaxlib ..") as its device, or
    its CPU model and bfloat16 support: one model name covers CPUs that differ ~2x (a Zen 3 and a Zen 4 EPYC)."""
    if not key:
        return "unrecorded"
    platform, kind, *rest = key.split("|")
    if platform != "cpu" or not rest:
        return kind
    model, _, bf16 = rest[0].rpartition(", ")
    return f"{model} ({bf16})" if model else rest[0]


def markdown(rows: list[dict], spec: dict) -> str:
    key, reference = spec["key"], spec["reference"]
    columns = [c for c in COLUMNS.get(key, HEADS) if any(c[1] in row or f"{c[1]}_mean" in row for row in rows)]
    paper = key in ("h", "dk")
    p_title = f"test BLEU p vs {key}={reference} (paired bootstrap, per seed pair)"
    titles = [t for t, _, _ in columns] + (["paper dev PPL", "paper dev BLEU"] if paper else []) + [p_title, "seeds", "commits", "machines"]
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
            cells += [f"{x}" for x in paper_numbers(key, row) or ("–", "–")]
        cells.append("reference" if row["value"] == reference else " / ".join(f"{p:.3f}" for p in row.get("p_values", [])) or "–")
        cells.append(str(row["seeds"]))
        cells.append(row["commits"])
        cells.append(row["machines"])
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"\nMean ± sample sd over seeds. p: sacreBLEU's paired bootstrap ({significance.RESAMPLES} resamples) of test "
            f"BLEU, seed k of the point against seed k of {key}={reference}, one p per seed pair. Speed columns "
            f"(tokens/s, wall s) are means over the row's runs, each timed on the machine named in machines: they compare "
            f"only between rows timed on one machine.\n")
    return "\n".join(lines) + "\n" + note


def reading_markdown(rows: list[dict], spec: dict) -> str:
    """Point by point: does its test BLEU differ from the reference's at p < 0.05 in every seed pair, and which
    way, beside the paper's dev BLEU difference for the same row (rows A and B)."""
    key, reference = spec["key"], spec["reference"]
    base = next((row for row in rows if row["value"] == reference), None)
    if base is None:
        return ""
    paper_base = paper_numbers(key, base)
    lines = [f"\n## Reading: what holds at p < 0.05\n",
             f"| {key} | test BLEU − {key}={reference}'s (means) | seed pairs with p < 0.05 | verdict | paper: dev BLEU − its {key}={reference}'s |",
             "|---|---:|---:|---|---:|"]
    for row in rows:
        if row["value"] == reference:
            continue
        delta = row["test_bleu_mean"] - base["test_bleu_mean"]
        p_values = row.get("p_values", [])
        below = sum(p < 0.05 for p in p_values)
        if not p_values:
            verdict = "no seed pair to test"
        elif below == len(p_values):
            verdict = f"**{'lower' if delta < 0 else 'higher'}** (every seed pair)"
        else:
            verdict = "no difference that holds in every seed pair"
        paper = paper_numbers(key, row)
        paper_delta = f"{paper[1] - paper_base[1]:+.1f}" if paper and paper_base else "–"
        lines.append(f"| {row['value']} | {delta:+.2f} | {below} of {len(p_values)} | {verdict} | {paper_delta} |")
    lines.append(f"\nA difference holds when sacreBLEU's paired bootstrap gives p < 0.05 in every seed pair (seed k against "
                 f"{key}={reference}'s seed k); the paper's differences are single runs on WMT14 newstest2013, without a test.\n")
    return "\n".join(lines) + "\n"


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
    first = run_curves[0][1]
    lines = [f"\n## Dev curves (evaluated every {first[1][0] - first[0][0]} steps)\n",
             f"| {key} | final dev loss | dev PPL gain over the last 20 % of steps | steps to dev loss {target:.3f} | "
             f"÷ {key}={reference}'s | runs |", "|---|---:|---:|---:|---:|---:|"]
    for value, entry in per_value.items():
        steps = mean(entry["steps"])
        ratio = f"{steps / reference_steps:.2f}" if reference_steps else "–"
        lines.append(f"| {value} | {mean(entry['final']):.3f}{spread(entry['final'], '.3f')} | "
                     f"{100 * mean(entry['tail']):.2f} %{spread([100 * t for t in entry['tail']], '.2f')} | "
                     f"{steps:,.0f}{spread(entry['steps'], ',.0f')} | {ratio} | {len(entry['final'])} |")
    lines.append(f"\nDev loss is the NLL per target token. Steps to {target:.3f} (the highest final dev loss of any run, "
                 "so every run reaches it) are interpolated linearly between evaluations; mean ± sd over seeds.\n")
    return "\n".join(lines) + "\n"


def plot_curves(run_curves: list[tuple[int | str, curves.Curve]], key: str, path: Path) -> None:
    """Dev loss against step, one line per run, one colour per swept value."""
    fig, ax = plt.subplots(figsize=(6, 4))
    colours = {value: f"C{i}" for i, value in enumerate(dict.fromkeys(v for v, _ in run_curves))}
    labelled = set()
    for value, curve in run_curves:
        if curve:
            ax.plot([c[0] for c in curve], [c[1] for c in curve], "-", color=colours[value], alpha=0.8,
                    label=None if value in labelled else f"{key} = {value}")
            labelled.add(value)
    ax.set(xlabel="training step", ylabel="dev loss (NLL per token)", yscale="log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_csv(rows: list[dict], path: Path) -> None:
    skip = ("point", "seed", "bleu_signature", "commit", "dirty", "machine")
    fields = [k for row in rows for k in row if k not in skip]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(fields)), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict], key: str, path: Path) -> None:
    """BLEU and perplexity against the swept value, mean ± std over seeds (the paper's on a twin axis)."""
    values = [row["value"] for row in rows]
    x = _positions(values)
    panels = 3 if key in DECODE_PANEL else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    for ax, field, label, paper_index in ((axes[0], "dev_bleu", "dev BLEU", 1), (axes[1], "dev_perplexity", "dev perplexity", 0)):
        ax.errorbar(x, [r[field + "_mean"] for r in rows], yerr=[r[field + "_std"] for r in rows],
                    marker="o", capsize=4, label="headcount, Multi30k de→en (mean ± std)")
        _value_axis(ax, values, X_LABELS.get(key, key))
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
    if key in DECODE_PANEL:
        ax = axes[2]
        for beam in (1, 4):
            ax.plot(x, [r[f"decode_tokens_per_s_beam{beam}_mean"] for r in rows], "o-", label=f"decode tokens/s, beam {beam}")
        _value_axis(ax, values, X_LABELS.get(key, key))
        ax.set_ylabel("decode tokens/s")
        twin = ax.twinx()
        twin.plot(x, [r["kv_cache_bytes_per_token_mean"] for r in rows], "s--", color="tab:gray", label="KV-cache bytes/token")
        twin.set_ylabel("KV-cache bytes per token", color="tab:gray")
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _positions(values: list) -> list:
    """Where the swept values sit on the x axis: counts at themselves (a log-2 axis), names evenly spaced."""
    return list(range(len(values))) if isinstance(values[0], str) else values


def _value_axis(ax, values, label) -> None:
    """The swept values on a log-2 axis (counts: heads, widths) or evenly spaced (names)."""
    if isinstance(values[0], str):
        ax.set_xticks(_positions(values), values, rotation=30)
    else:
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values])
    ax.set_xlabel(label)
