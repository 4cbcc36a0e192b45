"""The paper's own numbers (Vaswani et al. 2017, Table 3) beside the sweeps that replicate its rows."""

from __future__ import annotations

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
