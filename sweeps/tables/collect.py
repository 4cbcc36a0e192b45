"""`collect`: a sweep's page (NAME.md), CSV and plots, rebuilt from its committed files alone (sweeps/store.py).

A reading written at the top of the page is kept; everything below it is rewritten.
"""

from __future__ import annotations

import json
from pathlib import Path

from sweeps import curves, significance, store
from sweeps.tables.aggregate import aggregate, markdown, write_csv
from sweeps.tables.batches import batches_markdown, per_seed_markdown
from sweeps.tables.comparisons import contrasts_markdown, seed_markdown
from sweeps.tables.dev_curves import curves_markdown
from sweeps.tables.plots import plot, plot_curves
from sweeps.tables.prose import fill
from sweeps.tables.sensitivity import sweep_sensitivity_markdown


def collect(results_dir: Path, names: list[str] | None = None) -> list[Path]:
    """Write RESULTS_DIR/NAME.{md,csv,png} for every sweep stored under `results_dir` (or those in `names`)."""
    dirs = store.sweep_dirs(results_dir)
    if names is not None:
        dirs = [d for d in dirs if d.name in names]
        missing = sorted(set(names) - {d.name for d in dirs})
        if missing:
            raise FileNotFoundError(
                f"--results_dir {results_dir} holds no sweep {', '.join(missing)} (no NAME/{store.SPEC_FILE})"
            )
    if not dirs:
        raise FileNotFoundError(f"--results_dir {results_dir} holds no sweep (no NAME/{store.SPEC_FILE})")
    paths = []
    for sweep_dir in dirs:
        paths += collect_one(sweep_dir, Path(results_dir))
    return paths


# A written reading of a sweep's tables sits above this line in NAME.md; collect rewrites only what is below it.
READING_END = (
    "<!-- the reading ends here: `python sweep.py collect` writes the tables below and keeps the text above -->"
)


def kept_reading(path: Path) -> str:
    """The written reading at the top of the sweep table `path`, up to and with `READING_END` ("" where the file
    or the line is absent): collect keeps it, so that a reading and the tables it reads from stay one page."""
    if not path.exists():
        return ""
    head, end, _ = path.read_text(encoding="utf-8").partition(READING_END)
    return head + end + "\n\n" if end else ""


def collect_one(sweep_dir: Path, results_dir: Path) -> list[Path]:
    spec = store.read_spec(sweep_dir)
    results = store.load_results(sweep_dir, spec)
    if not results:
        raise FileNotFoundError(f"no finished point in {sweep_dir} (none has {store.RESULT_FILE})")
    configs = {
        (r["value"], r["seed"]): json.loads(
            (store.point_path(sweep_dir, spec["key"], r["value"], r["seed"]) / "config.json").read_text()
        )
        for r in results
    }
    for r in results:  # the step a run trained to, beside the step it is scored at (its best dev loss)
        r["num_train_steps"] = configs[r["value"], r["seed"]]["num_train_steps"]
    rows = aggregate(results, significance.seed_pair_p_values(sweep_dir, spec, results))
    stem = results_dir / spec["name"]
    paths = [stem.with_suffix(".md"), stem.with_suffix(".csv"), stem.with_suffix(".png")]
    split = next(iter(configs.values()))["data"]["eval_split"]
    run_curves = [(r["value"], curves.point_curve(sweep_dir, spec, r, split)) for r in results]
    registered = results_dir / f"{spec['name']}_registered.md"  # `sweep.py registered`'s: the primary analysis
    paths[0].write_text(
        kept_reading(paths[0])
        + (fill("registered_link", file=registered.name) + "\n\n" if registered.exists() else "")
        + seed_markdown(results, spec, primary=not registered.exists())
        + contrasts_markdown(results, spec, primary=not registered.exists())
        + batches_markdown(results, spec)
        + sweep_sensitivity_markdown(results, spec, primary=not registered.exists())
        + per_seed_markdown(results, spec)
        + "\n## Means over seeds\n\n"
        + markdown(rows, spec)
        + curves_markdown(run_curves, spec)
    )
    write_csv(rows, paths[1])
    plot(rows, spec["key"], paths[2])
    if any(curve for _, curve in run_curves):
        paths.append(stem.parent / f"{spec['name']}_curves.png")
        plot_curves(run_curves, spec["key"], paths[-1])
    return paths
