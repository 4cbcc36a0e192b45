"""The sensitivity tables: each comparison again with seeds as blocks and with one variance pooled over all
points, beside the batches its seeds ran in. They give no verdicts.
"""

from __future__ import annotations

from sweeps import significance
from sweeps.tables.batches import batch_label, batch_letters, batch_summary, crosses_batches, seed_batches
from sweeps.tables.cells import SENSITIVITY, ci_cell, p_cell, signed_cell
from sweeps.tables.comparisons import bleu_by_value, reference_comparisons
from sweeps.tables.prose import fill
from training.core.markdown import markdown_table

SENSITIVITY_TITLES = [
    "batches by seed (from → to)",
    "crosses batches",
    "paired seeds",
    "difference, paired (BLEU)",
    "95 % CI",
    "p (paired t, two-sided)",
    "p, Holm",
    "95 % CI, pooled variance",
    "p (pooled t, two-sided)",
    "p, Holm",
    "primary: p, Holm (Welch)",
]


def sensitivity_table(
    comparisons: dict[str, tuple],
    groups: dict[object, list[dict]],
    family: int,
    primary: dict[str, significance.SeedComparison],
    letters: dict[str, str],
    welch_title: str = SENSITIVITY_TITLES[-1],
) -> list[str]:
    """The markdown lines of one family's sensitivity table. `comparisons`: label -> (from, to), two keys of
    `groups` (each a point's runs); a comparison a side of which has no scored seed is left out (the primary
    table says "not run yet"). Each row: its seeds' batches, whether it crosses batches, seeds as blocks
    (`significance.paired_seeds`) and one variance pooled over every group (`significance.pooled_contrasts`),
    both Holm-adjusted over `family`, and `primary`'s Holm p beside them (its column titled `welch_title`)."""
    seeds = {k: {r["seed"]: r["test_bleu"] for r in runs if "test_bleu" in r} for k, runs in groups.items()}
    seeds = {k: by_seed for k, by_seed in seeds.items() if by_seed}
    ready = {label: pair for label, pair in comparisons.items() if all(side in seeds for side in pair)}
    paired = significance.adjust(
        {label: significance.paired_seeds(seeds[to], seeds[start]) for label, (start, to) in ready.items()}, family
    )
    pooled = significance.adjust(
        significance.pooled_contrasts({k: list(s.values()) for k, s in seeds.items()}, ready), family
    )
    rows = []
    for label, (start, to) in ready.items():
        a, b = paired[label], pooled[label]
        batch_of = [{r["seed"]: batch_label(r) for r in groups[side]} for side in (start, to)]
        within = sum(batch_of[0][seed] == batch_of[1][seed] for seed in a.seeds)
        cells = [
            label,
            " → ".join(" ".join(seed_batches(groups[side], letters)) for side in (start, to)),
            "yes" if crosses_batches(groups[start] + groups[to]) else "no",
            f"{_seed_list(a.seeds)} ({within} in one batch)",
            signed_cell(a.difference),
            ci_cell(a),
            p_cell(a.p),
            p_cell(a.p_holm),
            ci_cell(b),
            p_cell(b.p),
            p_cell(b.p_holm),
            p_cell(primary[label].p_holm) if label in primary else "–",
        ]
        rows.append(cells)
    titles = ["comparison", *SENSITIVITY_TITLES[:-1], welch_title]
    return [SENSITIVITY, *markdown_table(titles, rows, "lll" + "r" * (len(SENSITIVITY_TITLES) - 2)).split("\n")]


def _seed_list(seeds: tuple[int, ...]) -> str:
    """(0, 1, 2, 3, 4) -> "0–4"; (0, 2) -> "0, 2"; () -> "none"."""
    if not seeds:
        return "none"
    if len(seeds) > 2 and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def sensitivity_text(family: str, runs: int, points: int) -> str:
    """What the sensitivity tables compute; `family`: which comparisons each Holm adjustment runs over."""
    return fill("sensitivity", family=family, runs=runs, points=points, df=runs - points)


def sweep_sensitivity_markdown(results: list[dict], spec: dict, primary: bool = True) -> str:
    """The sensitivity analyses (`sensitivity_table`) of the sweep's Welch family and of its contrasts, with
    one variance pooled over all of the sweep's points; "" before the reference has a seed. Not `primary` where a
    registered analysis is: the Welch column is then titled as the secondary one."""
    welch = reference_comparisons(results, spec)
    if not welch:
        return ""
    title = SENSITIVITY_TITLES[-1] if primary else "secondary: p, Holm (Welch)"
    key, reference = spec["key"], spec["reference"]
    groups = {v: [r for r in results if r["value"] == v] for v in spec["values"]}
    groups = {v: runs for v, runs in groups.items() if runs}
    letters = batch_letters(results)
    label = {v: f"{key} = {reference} → {v}" for v in spec["values"] if v != reference}
    comparisons = {label[v]: (reference, v) for v in label}
    family = significance.family_size([c.p for c in welch.values()], len(label))
    lines = [
        "## Sensitivity (no verdicts): seeds as blocks, one pooled variance\n",
        f"Against {key} = {reference}:\n",
        *sensitivity_table(comparisons, groups, family, {label[v]: c for v, c in welch.items()}, letters, title),
    ]
    contrasts = {name: (a, b) for name, a, b in spec.get("contrasts") or []}
    if contrasts:
        bleu = bleu_by_value(results)
        tests = significance.adjust(
            {
                name: significance.compare_seeds(bleu[b], bleu[a])
                for name, (a, b) in contrasts.items()
                if a in bleu and b in bleu
            },
            len(contrasts),
        )
        lines += [
            "",
            "The decomposition:\n",
            *sensitivity_table(contrasts, groups, len(contrasts), tests, letters, title),
        ]
    lines.append(
        "\n"
        + sensitivity_text(
            "the same family as the " + ("primary" if primary else "secondary (Welch)") + " table's",
            sum(map(len, groups.values())),
            len(groups),
        )
    )
    lines.append("\n" + batch_summary(comparisons | contrasts, groups) + "\n")
    return "\n".join(lines) + "\n"
