"""Markdown pipe tables, written in one place.

Sweeps, analysis, training reports and the benchmarks all print this one format (and results/ commits what they
print), so one function spells it: a change to how a table is written is made here once, and no caller can get an
alignment row or a row's cell count out of step with its header. Standard library only, so bench/ scripts and
sweeps/ import it at no cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

ALIGNMENTS = {"l": "---", "r": "---:", "c": ":---:"}


def cell(value: object) -> str:
    """A value as one cell's text: `str(value)` with any `|` escaped (a bare one would end the cell)."""
    return str(value).replace("|", "\\|")


def markdown_table(headers: Sequence[object], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """The table's lines joined with newlines (none after the last): the header, the alignment row, one line a row.

    A line is `| a | b |` (an empty cell `|  |`), the alignment row `|---|---:|` with no spaces; `align` has one
    letter a column, `l` (`---`), `r` (`---:`) or `c` (`:---:`), and left-aligns every column when empty. Each cell
    is `cell(value)`; a row with a different number of cells than `headers` is refused. No rows: header and
    alignment row alone.
    """
    align = align or "l" * len(headers)
    if len(align) != len(headers) or set(align) - set(ALIGNMENTS):
        raise ValueError(f"align {align!r} must have one of l, r, c for each of the {len(headers)} columns")
    lines = [_line(headers), "|" + "".join(ALIGNMENTS[a] + "|" for a in align)]
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"row {i} has {len(row)} cells for {len(headers)} columns: {list(row)!r}")
        lines.append(_line(row))
    return "\n".join(lines)


def _line(cells: Iterable[object]) -> str:
    return "| " + " | ".join(cell(c) for c in cells) + " |"
