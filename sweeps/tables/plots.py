"""A sweep's plots: BLEU and perplexity against the swept value (with decode speed and cache size where the
sweep varies them), and every run's dev-loss curve.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from sweeps import curves
from sweeps.tables.paper import PAPER_HEADS

X_LABELS = {
    "h": "heads h (d_k = d_v = d_model / h)",
    "shape": "heads and head size (h, d_k = d_v)",
    "kv": "KV heads (h = 8)",
    "dk": "query/key width d_k per head (h = 8, d_v fixed)",
    "attention": "attention_type (h = 8)",
}
DECODE_PANEL = ("kv", "attention")  # sweeps whose plot adds decode speed and cache size


def plot_curves(run_curves: list[tuple[int | str, curves.Curve]], key: str, path: Path) -> None:
    """Dev loss against step, one line per run, one colour per swept value."""
    fig, ax = plt.subplots(figsize=(6, 4))
    colours = {value: f"C{i}" for i, value in enumerate(dict.fromkeys(v for v, _ in run_curves))}
    labelled = set()
    for value, curve in run_curves:
        if curve:
            ax.plot(
                [c[0] for c in curve],
                [c[1] for c in curve],
                "-",
                color=colours[value],
                alpha=0.8,
                label=None if value in labelled else f"{key} = {value}",
            )
            labelled.add(value)
    ax.set(xlabel="training step", ylabel="dev loss (NLL per token)", yscale="log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot(rows: list[dict], key: str, path: Path) -> None:
    """BLEU and perplexity against the swept value, mean ± std over seeds (the paper's on a twin axis)."""
    values = [row["value"] for row in rows]
    x = _positions(values)
    panels = 3 if key in DECODE_PANEL else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    for ax, field, label, paper_index in (
        (axes[0], "dev_bleu", "dev BLEU", 1),
        (axes[1], "dev_perplexity", "dev perplexity", 0),
    ):
        ax.errorbar(
            x,
            [r[field + "_mean"] for r in rows],
            yerr=[r[field + "_std"] for r in rows],
            marker="o",
            capsize=4,
            label="headcount, Multi30k de→en (mean ± std)",
        )
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
            ax.plot(
                x,
                [r[f"decode_tokens_per_s_beam{beam}_mean"] for r in rows],
                "o-",
                label=f"decode tokens/s, beam {beam}",
            )
        _value_axis(ax, values, X_LABELS.get(key, key))
        ax.set_ylabel("decode tokens/s")
        twin = ax.twinx()
        twin.plot(
            x, [r["kv_cache_bytes_per_token_mean"] for r in rows], "s--", color="tab:gray", label="KV-cache bytes/token"
        )
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
