"""The readings use verdict words only where the primary analysis gave them.

A verdict word (**lower**, **higher**, **equivalent**) belongs to a comparison the primary analysis tested: the
registered analysis where a sweep has one, else the sweep's own seed-level tables, or the study's. The generated
tables carry a marker on the line above their header (`sweeps.tables.PRIMARY`, `SECONDARY`, `SENSITIVITY`), and a
comparison's figures include its 95 % interval, so a sentence is checked by its intervals: every interval in a
sentence (or a hand-written table row) that has a verdict word must be one a primary table prints.
"""

from __future__ import annotations

import re
from pathlib import Path

from sweeps import tables

ROOT = Path(__file__).resolve().parents[2]
MARKERS = {tables.PRIMARY: "primary", tables.SECONDARY: "secondary", tables.SENSITIVITY: "sensitivity"}
VERDICT = re.compile(r"\*\*(lower|higher|equivalent)")
NUMBER = r"[+\-−]?\d+\.\d+"
INTERVAL = re.compile(rf"\[({NUMBER}), ({NUMBER})\]")
SENTENCE_END = re.compile(r"(?<=[.;])\s+(?=[A-Z*\"(])")


def interval(low: str, high: str) -> tuple[float, float]:
    """An interval as numbers: the readings write the minus sign as −, the tables as -."""
    return float(low.replace("−", "-")), float(high.replace("−", "-"))


def parse(text: str) -> tuple[dict[tuple[float, float], set[str]], list[str]]:
    """A page's marked tables' intervals ({interval: the kinds of analysis that print it}) and its units of prose:
    sentences of its paragraphs and list items, and the rows of its unmarked (hand-written) tables."""
    sources: dict[tuple[float, float], set[str]] = {}
    units: list[str] = []
    block: list[str] = []
    kind = None  # the marker above the table being read, if any

    def flush() -> None:
        prose = re.sub(r"<!--.*?-->", "", " ".join(block), flags=re.S)
        units.extend(s for s in SENTENCE_END.split(prose) if s.strip())
        block.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped in MARKERS:
            flush()
            kind = MARKERS[stripped]
        elif stripped.startswith("|"):
            flush()
            if kind is None:
                units.append(stripped)
            else:
                for low, high in INTERVAL.findall(stripped):
                    sources.setdefault(interval(low, high), set()).add(kind)
        else:
            kind = None
            if not stripped or stripped.startswith(("- ", "* ", "#")):
                flush()
            block.append(stripped)
    flush()
    return sources, units


def misread(pages: dict[str, str]) -> list[str]:
    """Every sentence of `pages` ({name: markdown}) with a verdict word and an interval no primary table prints,
    named with the page, the interval and where the interval comes from."""
    parsed = {name: parse(text) for name, text in pages.items()}
    sources: dict[tuple[float, float], set[str]] = {}
    for page_sources, _ in parsed.values():
        for ci, kinds in page_sources.items():
            sources.setdefault(ci, set()).update(kinds)
    found = []
    for name, (_, units) in parsed.items():
        for unit in units:
            if not VERDICT.search(unit):
                continue
            for low, high in INTERVAL.findall(unit):
                kinds = sources.get(interval(low, high), set())
                if "primary" not in kinds:
                    origin = " and ".join(sorted(kinds)) or "no generated table"
                    found.append(f"{name}: [{low}, {high}] is from {origin}: {unit[:160]}")
    return found


def repository_pages() -> dict[str, str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "results").rglob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}


def test_every_verdict_word_reads_a_primary_analysis():
    assert misread(repository_pages()) == []


def page(verdict_kind: str) -> dict[str, str]:
    """A sweep page whose table of kind `verdict_kind` prints [-0.67, -0.03], and a reading that calls it lower."""
    marker = {"primary": tables.PRIMARY, "secondary": tables.SECONDARY, "sensitivity": tables.SENSITIVITY}
    table = "\n".join(
        [
            marker[verdict_kind],
            "| shape | difference | 95 % CI | verdict |",
            "|---|---:|---:|---|",
            "| h32 | -0.35 | [-0.67, -0.03] | x |",
            "",
        ]
    )
    reading = "Caveats. The paper's h = 32 against h = 8 **lower** by 0.35 [−0.67, −0.03]. Next sentence.\n"
    return {"sweep.md": table, "reading.md": reading}


def test_a_verdict_word_on_a_secondary_or_sensitivity_figure_is_found():
    assert misread(page("primary")) == []
    for kind in ("secondary", "sensitivity"):
        (found,) = misread(page(kind))
        assert found.startswith(f"reading.md: [−0.67, −0.03] is from {kind}")
    # a figure no generated table prints is not a primary one either; the same words without the bold are not
    # a verdict
    assert len(misread({"reading.md": page("primary")["reading.md"]})) == 1
    assert misread({"reading.md": "Lower by 0.35 [−0.67, −0.03], a lead."}) == []


def test_hand_written_table_rows_are_read_row_by_row():
    pages = page("secondary")
    pages["reading.md"] = "| contrast | d | verdict |\n|---|---|---|\n| h32 | −0.35 [−0.67, −0.03] | **lower** |\n"
    assert len(misread(pages)) == 1
    pages["sweep.md"] = pages["sweep.md"].replace(tables.SECONDARY, tables.PRIMARY)
    assert misread(pages) == []
