"""Tables (markdown, CSV) and plots of a sweep, rebuilt from its committed files alone.

`collect` writes a sweep's page, CSV and plots; each of the other modules builds one kind of table or plot, and
the prose around the tables lives in sweeps/templates/. Every name other code uses is importable from here, as
`tables.collect` or `tables.PRIMARY`.
"""

from sweeps.tables.aggregate import (
    COLUMNS,
    HEADS,
    PER_SEED_FIELDS,
    SCORES,
    SPREAD_FIELDS,
    TRAIN,
    aggregate,
    machines,
    markdown,
    write_csv,
)
from sweeps.tables.batches import (
    PER_SEED,
    _letter,
    batch_label,
    batch_letters,
    batch_summary,
    batches_legend,
    batches_markdown,
    crosses_batches,
    machine_label,
    per_seed_markdown,
    seed_batches,
)
from sweeps.tables.cells import (
    COMPARISON_ALIGN,
    COMPARISON_TITLES,
    NO_VERDICT,
    PRIMARY,
    SECONDARY,
    SENSITIVITY,
    ci_cell,
    comparison_cells,
    p_cell,
    signed_cell,
    verdict_cell,
)
from sweeps.tables.collect import READING_END, collect, collect_one, kept_reading
from sweeps.tables.comparisons import (
    bleu_by_seed,
    bleu_by_value,
    contrasts_markdown,
    detectable_text,
    reference_comparisons,
    seed_markdown,
    verdict_line,
)
from sweeps.tables.dev_curves import curves_markdown, evaluation_cadence
from sweeps.tables.paper import PAPER_DK_RATIO, PAPER_HEADS, paper_numbers
from sweeps.tables.plots import DECODE_PANEL, X_LABELS, plot, plot_curves
from sweeps.tables.prose import TEMPLATES, fill, template
from sweeps.tables.sensitivity import (
    SENSITIVITY_TITLES,
    sensitivity_table,
    sensitivity_text,
    sweep_sensitivity_markdown,
)

__all__ = [
    "COLUMNS",
    "COMPARISON_ALIGN",
    "COMPARISON_TITLES",
    "DECODE_PANEL",
    "HEADS",
    "NO_VERDICT",
    "PAPER_DK_RATIO",
    "PAPER_HEADS",
    "PER_SEED",
    "PER_SEED_FIELDS",
    "PRIMARY",
    "READING_END",
    "SCORES",
    "SECONDARY",
    "SENSITIVITY",
    "SENSITIVITY_TITLES",
    "SPREAD_FIELDS",
    "TEMPLATES",
    "TRAIN",
    "X_LABELS",
    "_letter",
    "aggregate",
    "batch_label",
    "batch_letters",
    "batch_summary",
    "batches_legend",
    "batches_markdown",
    "bleu_by_seed",
    "bleu_by_value",
    "ci_cell",
    "collect",
    "collect_one",
    "comparison_cells",
    "contrasts_markdown",
    "crosses_batches",
    "curves_markdown",
    "detectable_text",
    "evaluation_cadence",
    "fill",
    "kept_reading",
    "machine_label",
    "machines",
    "markdown",
    "p_cell",
    "paper_numbers",
    "per_seed_markdown",
    "plot",
    "plot_curves",
    "reference_comparisons",
    "seed_batches",
    "seed_markdown",
    "sensitivity_table",
    "sensitivity_text",
    "signed_cell",
    "sweep_sensitivity_markdown",
    "template",
    "verdict_cell",
    "verdict_line",
    "write_csv",
]
