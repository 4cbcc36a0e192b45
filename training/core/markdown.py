"""Markdown pipe tables, written in one place.

Sweeps, analysis, training reports and the benchmarks all print this one format (and results/ commits what they
print), so one function spells it: a change to how a table is written is made here once, and no caller can get an
alignment row or a row's cell count out of step with its header. A script that prints each row as it is measured
prints `markdown_table(headers, [], align)` first and then `markdown_row(cells)` a row. Standard library only, so
bench/ scripts and sweeps/ import it at no cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

ALIGNMENTS = {"l": "---", "r": "---:", "c": ":---:"}


def markdown_table(headers: Sequence[object], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """The table's lines joined with newlines (none after the last): the header, the alignment row, one line a row.

    `align` has one letter a column, `l` (`---`), `r` (`---:`) or `c` (`:---:`), and left-aligns every column when
    empty; the alignment row has no spaces (`|---|---:|`). Each line is `markdown_row`'s. A row with a different
    number of cells than `headers` is refused. No rows: the header and the alignment row alone.
    """
    align = align or "l" * len(headers)
    if len(align) != len(headers) or set(align) - set(ALIGNMENTS):
        raise ValueError(f"align {align!r} must have one of l, r, c for each of the {len(headers)} columns")
    lines = [markdown_row(headers), "|" + "".join(ALIGNMENTS[a] + "|" for a in align)]
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"row {i} has {len(row)} cells for {len(headers)} columns: {list(row)!r}")
        lines.append(markdown_row(row))
    return "\n".join(lines)


def markdown_row(cells: Iterable[object]) -> str:
    """One line of a table, `| a | b |` (an empty cell `|  |`): each cell `str(value)` with any `|` escaped, since a
    bare one would end the cell."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
