"""Rows of dicts to CSV and to a markdown table (floats rounded, NaN left blank)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from training.core.markdown import markdown_table


def _cell(value, digits: int) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def write(rows, fields, csv_path: Path | None = None, md_path: Path | None = None, digits: int = 4) -> None:
    """The `fields` of `rows` to `csv_path` (`digits` decimals) and `md_path` (2 decimals, numbers right-aligned)."""
    if csv_path is not None:
        with open(csv_path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(fields)
            writer.writerows([_cell(r[k], digits) for k in fields] for r in rows)
    if md_path is not None:
        align = "".join("r" if all(isinstance(r[k], (int, float)) for r in rows) else "l" for k in fields)
        md_path.write_text(markdown_table(fields, [[_cell(r[k], 2) for k in fields] for r in rows], align) + "\n")
