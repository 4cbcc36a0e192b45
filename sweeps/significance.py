"""Is a sweep point's test BLEU different from the reference point's? sacreBLEU's own paired bootstrap, per seed pair.

Seed k of a point is compared with seed k of the reference point (same data order, same
initialisation seed), on the same test sentences: sacrebleu.significance.PairedTest with
test_type='bs' (the Moses paired bootstrap, as `sacrebleu --paired-bs` runs it), 1000 resamples,
sacreBLEU's default resampling seed (SACREBLEU_SEED, 12345).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from sweeps import store

RESAMPLES = 1000


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str], references: Sequence[str], resamples: int = RESAMPLES) -> float:
    """p-value of "system's corpus BLEU differs from baseline's only by chance" (13a, cased, one reference)."""
    if not len(baseline) == len(system) == len(references):
        raise ValueError(f"baseline, system and references must be the same sentences: got {len(baseline)}, {len(system)} "
                         f"and {len(references)} lines")
    logger = logging.getLogger("sacrebleu")  # it narrates each test at INFO; a table takes dozens
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        test = PairedTest([("baseline", list(baseline)), ("system", list(system))], {"BLEU": BLEU()}, [list(references)],
                          test_type="bs", n_samples=resamples)
        _, scores = test()
    finally:
        logger.setLevel(level)
    return scores["BLEU"][1].p_value


def seed_pair_p_values(sweep_dir: Path, spec: dict, results: list[dict]) -> dict[int | str, list[float]]:
    """{value: [p of seed k against the reference's seed k, for each seed both have]}; {} without a test split."""
    split = spec.get("test_split")
    references_file = store.references_path(sweep_dir, split) if split else None
    if references_file is None or not references_file.exists():
        return {}
    references = _lines(references_file)
    reference_seeds = {r["seed"] for r in results if r["value"] == spec["reference"]}
    p_values = {}
    for value in dict.fromkeys(r["value"] for r in results):
        if value == spec["reference"]:
            continue
        p_values[value] = []
        for seed in sorted(r["seed"] for r in results if r["value"] == value and r["seed"] in reference_seeds):
            hypotheses = [_lines(store.point_path(sweep_dir, spec["key"], v, seed) / store.hypotheses_name(split))
                          for v in (spec["reference"], value)]
            p_values[value].append(paired_bootstrap(*hypotheses, references))
    return p_values


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]
