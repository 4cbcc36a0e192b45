"""Tables (markdown, CSV) and plots of a sweep, rebuilt from its committed files alone (sweeps/store.py).

The prose around the tables (how each is computed, what a column means) lives in sweeps/templates/NAME.md, one
`string.Template` a file (`${field}` placeholders; the file's final newline is not part of the text): the code
formats the numbers and fills the fields (`fill`), the text reads as text. The templates are read from the
checkout beside this module (sweeps/ is not in the wheel, which holds `attention` alone).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import statistics
import string
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from sweeps import curves, significance, store
from training.core.markdown import markdown_table

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


# (column title, result field, format); fields in SPREAD_FIELDS read "mean ± sd" over seeds.
SCORES = [
    ("dev PPL", "dev_perplexity", "{:.2f}"),
    ("dev BLEU", "dev_bleu", "{:.2f}"),
    ("test PPL", "test_perplexity", "{:.2f}"),
    ("test BLEU", "test_bleu", "{:.2f}"),
]
TRAIN = [("train tokens/s", "train_tokens_per_s", "{:,.0f}"), ("train wall s", "train_seconds", "{:,.0f}")]
HEADS = [
    ("h", "num_heads", "{:d}"),
    ("d_k", "head_dim", "{:d}"),
    ("parameters", "parameters", "{:,d}"),
    *SCORES,
    *TRAIN,
]
COLUMNS = {  # by the sweep's key; any other key gets HEADS' columns
    "h": HEADS,
    "kv": [
        ("h", "num_heads", "{:d}"),
        ("kv heads", "num_kv_heads", "{:d}"),
        ("d_k", "head_dim", "{:d}"),
        ("parameters", "parameters", "{:,d}"),
        *SCORES,
        ("KV-cache bytes/token", "kv_cache_bytes_per_token", "{:,.0f}"),
        ("greedy tokens/s", "decode_tokens_per_s_beam1", "{:,.0f}"),
        ("beam-4 tokens/s", "decode_tokens_per_s_beam4", "{:,.0f}"),
        *TRAIN,
    ],
    "dk": [
        ("h", "num_heads", "{:d}"),
        ("d_k", "head_dim", "{:d}"),
        ("d_v", "v_head_dim", "{:d}"),
        ("parameters", "parameters", "{:,d}"),
        *SCORES,
        *TRAIN,
    ],
    "attention": [
        ("attention_type", "value", "{}"),
        ("parameters", "parameters", "{:,d}"),
        *SCORES,
        ("KV-cache bytes/token", "kv_cache_bytes_per_token", "{:,.0f}"),
        ("greedy tokens/s", "decode_tokens_per_s_beam1", "{:,.0f}"),
        ("beam-4 tokens/s", "decode_tokens_per_s_beam4", "{:,.0f}"),
        *TRAIN,
    ],
}
SPREAD_FIELDS = {"dev_perplexity", "dev_bleu", "test_perplexity", "test_bleu"}
X_LABELS = {
    "h": "heads h (d_k = d_v = d_model / h)",
    "shape": "heads and head size (h, d_k = d_v)",
    "kv": "KV heads (h = 8)",
    "dk": "query/key width d_k per head (h = 8, d_v fixed)",
    "attention": "attention_type (h = 8)",
}
DECODE_PANEL = ("kv", "attention")  # sweeps whose plot adds decode speed and cache size
TEMPLATES = Path(__file__).with_name("templates")


@functools.cache
def template(name: str) -> string.Template:
    """sweeps/templates/NAME.md as a template, less the newline that ends the file."""
    return string.Template((TEMPLATES / f"{name}.md").read_text(encoding="utf-8").removesuffix("\n"))


def fill(name: str, **fields: object) -> str:
    """The text of template `name` with its `fields` filled in (a field it names but is not given: KeyError)."""
    return template(name).substitute(fields)


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


# Each comparison table carries one of these markers on the line above its header, so that a reading can be checked
# against where its figures come from: verdict words (lower, higher, equivalent) belong to the primary analysis
# alone (tests/test_readings.py). Secondary and sensitivity tables give no verdicts.
PRIMARY = "<!-- analysis: primary (verdicts) -->"
SECONDARY = "<!-- analysis: secondary (no verdicts) -->"
SENSITIVITY = "<!-- analysis: sensitivity (no verdicts) -->"
NO_VERDICT = "secondary: no verdict"  # the verdict cell of a secondary table


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


def bleu_by_seed(results: list[dict], metric: str = "test_bleu") -> dict[int | str, dict[int, float]]:
    """Each value's {seed: `metric`}, in seed order."""
    by_value: dict[int | str, dict[int, float]] = {}
    for r in sorted(results, key=lambda r: r["seed"]):
        if metric in r:
            by_value.setdefault(r["value"], {})[r["seed"]] = r[metric]
    return by_value


def bleu_by_value(results: list[dict], metric: str = "test_bleu") -> dict[int | str, list[float]]:
    """Each value's per-seed `metric`, in seed order."""
    by_value: dict[int | str, list[float]] = {}
    for r in sorted(results, key=lambda r: r["seed"]):
        if metric in r:
            by_value.setdefault(r["value"], []).append(r[metric])
    return by_value


def _steps(runs: list[dict]) -> str:
    """The scored step of each seed, in seed order ("3,600 / 4,000 / 4,000 of 4,000")."""
    runs = sorted(runs, key=lambda r: r["seed"])
    trained = {r.get("num_train_steps") for r in runs} - {None}
    suffix = f" of {trained.pop():,}" if len(trained) == 1 else ""
    return " / ".join(f"{r['step']:,}" for r in runs if "step" in r) + suffix


def p_cell(p: float) -> str:
    """A p value as the tables print it: 3 decimals, "< 0.001" below, "–" for NaN (not tested)."""
    return "–" if math.isnan(p) else "< 0.001" if p < 0.001 else f"{p:.3f}"


def _pair_p(p: float) -> str:
    """A per-pair randomization p: 3 decimals, 4 below 0.001 (its floor is 1 / (trials + 1), 0.0001)."""
    return f"{p:.4f}" if p < 0.001 else f"{p:.3f}"


def signed_cell(x: float, fmt: str = ".2f") -> str:
    """A difference with its sign ("–" for NaN)."""
    return "–" if math.isnan(x) else f"{x:+{fmt}}"


def verdict_cell(c: significance.SeedComparison, primary: bool = True) -> str:
    """A comparison's verdict as a table prints it (bold where it is a difference); `NO_VERDICT` where the table is
    not the primary analysis."""
    if not primary:
        return NO_VERDICT
    return f"**{c.verdict}**" if c.verdict in ("lower", "higher") else c.verdict


def comparison_cells(c: significance.SeedComparison, primary: bool = True) -> list[str]:
    ci = "–" if math.isnan(c.ci_low) else f"[{c.ci_low:+.2f}, {c.ci_high:+.2f}]"
    return [
        signed_cell(c.difference),
        ci,
        signed_cell(c.hedges_g),
        p_cell(c.p),
        p_cell(c.p_holm),
        p_cell(c.tost_p_holm),
        "–" if math.isnan(c.mdd) else f"{c.mdd:.2f}",
        verdict_cell(c, primary),
    ]


COMPARISON_TITLES = [
    "difference (BLEU)",
    "95 % CI",
    "Hedges' g",
    "p (Welch, two-sided)",
    "p, Holm",
    f"equivalence p (TOST ±{significance.MARGIN:g}), Holm",
    "detectable difference (80 % power at Holm's α / m)",
    "verdict",
]
COMPARISON_ALIGN = "r" * (len(COMPARISON_TITLES) - 1) + "l"  # the numbers right, the verdict left


def detectable_text(family: int, what: str) -> str:
    """How the detectable-difference column is computed, with its level for a Holm family of `family`."""
    return fill(
        "detectable",
        alpha=f"{significance.ALPHA:g}",
        family=family,
        level=f"{significance.ALPHA / family:.4f}",
        what=what,
        power=f"{significance.POWER * 100:g}",
    )


def reference_comparisons(results: list[dict], spec: dict) -> dict[int | str, significance.SeedComparison]:
    """The primary family: every value with seeds against the reference (`significance.table_comparisons`,
    Holm over the sweep's values but the reference); {} before the reference has a seed."""
    bleu, reference = bleu_by_value(results), spec["reference"]
    if reference not in bleu:
        return {}
    return significance.table_comparisons(
        {v: b for v, b in bleu.items() if v != reference}, bleu[reference], planned=len(spec["values"]) - 1
    )


def seed_markdown(results: list[dict], spec: dict, primary: bool = True) -> str:
    """The primary table: each value's test BLEU against the reference's, seeds as the unit of replication
    (significance.table_comparisons: Welch, Hedges' g, Holm over the table, TOST), with the scored steps;
    a value of the sweep with no finished seed reads "not run yet". Not `primary` where a registered
    analysis is (`sweeps.registered`): its title says so, and it gives no verdicts."""
    key, reference = spec["key"], spec["reference"]
    bleu = bleu_by_value(results)
    if reference not in bleu:
        return ""
    compared = reference_comparisons(results, spec)
    paper = key in ("h", "dk")
    base = next((r for r in results if r["value"] == reference), {})
    first = min(r["seed"] for r in results)  # a replication's seeds start later (SWEEP_FIRST_SEED)
    titles = [key, "seeds", "test BLEU (mean)", *COMPARISON_TITLES, f"scored steps (seed {first} / {first + 1} / ...)"]
    titles += [f"paper: dev BLEU − {key}={reference}'s"] if paper else []
    rows = []
    for value in spec["values"]:
        runs = [r for r in results if r["value"] == value]
        if not runs:
            rows.append([value, 0, "not run yet"] + [""] * (len(titles) - 3))
            continue
        cells = [str(value), str(len(runs)), f"{statistics.fmean(bleu[value]):.2f}"]
        cells += (
            ["reference"] + [""] * (len(COMPARISON_TITLES) - 1)
            if value == reference
            else comparison_cells(compared[value], primary)
        )
        cells.append(_steps(runs))
        if paper:
            ours, theirs = paper_numbers(key, runs[0]), paper_numbers(key, base)
            cells.append(f"{ours[1] - theirs[1]:+.1f}" if ours and theirs and value != reference else "–")
        rows.append(cells)
    lines = [
        f"## Test BLEU against {key} = {reference}, over seeds "
        + ("(the primary result)\n" if primary else "(secondary: the registered analysis above is primary)\n"),
        PRIMARY if primary else SECONDARY,
        markdown_table(titles, rows, "lrr" + COMPARISON_ALIGN + "l" + ("r" if paper else "")),
    ]
    holm_m = significance.family_size([c.p for c in compared.values()], len(spec["values"]) - 1)
    if primary:
        lines.append("\n" + verdict_line(key, compared))
    note = fill(
        "seed_table",
        verdicts=fill("verdict_rule", margin=f"{significance.MARGIN:g}") if primary else fill("no_verdicts"),
        test_split=spec.get("test_split") or "the test split",
        holm_m=holm_m,
        comparisons="comparison" if holm_m == 1 else "comparisons",
        margin=f"{significance.MARGIN:g}",
        detectable=detectable_text(holm_m, "this table's comparisons"),
    )
    lines.append(f"\n{note}\n")
    return "\n".join(lines) + "\n"


def verdict_line(key: str, compared: dict) -> str:
    """The table's verdicts in one sentence ("Lower: h = 32. Undetermined: h = 1, 2."), the seeds' counts beside."""
    groups: dict[str, list[str]] = {}
    for value, c in compared.items():
        groups.setdefault(c.verdict, []).append(f"{value}")
    order = [v for v in significance.VERDICTS if v in groups]
    return "**Reading.** " + " ".join(
        f"{verdict[0].upper()}{verdict[1:]}: {key} = {', '.join(groups[verdict])}." for verdict in order
    )


def contrasts_markdown(results: list[dict], spec: dict, primary: bool = True) -> str:
    """The sweep's named comparisons between two of its values (spec "contrasts": [label, from, to]), seed level,
    Holm over them; a side without finished seeds reads "not run yet". Not `primary` (no verdicts) where a
    registered analysis is."""
    contrasts = spec.get("contrasts") or []
    if not contrasts:
        return ""
    bleu = bleu_by_value(results)
    ready = {label: (bleu[a], bleu[b]) for label, a, b in contrasts if a in bleu and b in bleu}
    tests = significance.adjust(
        {label: significance.compare_seeds(to, start) for label, (start, to) in ready.items()}, len(contrasts)
    )
    titles = ["comparison", "from → to", "seeds", *COMPARISON_TITLES]
    rows = []
    for label, a, b in contrasts:
        if label not in tests:
            missing = " and ".join(v for v in (a, b) if v not in bleu)
            rows.append([label, f"{a} → {b}", "–", f"{missing} not run yet"] + [""] * (len(COMPARISON_TITLES) - 1))
        else:
            rows.append(
                [label, f"{a} → {b}", f"{len(bleu[a])} → {len(bleu[b])}", *comparison_cells(tests[label], primary)]
            )
    lines = [
        "## The decomposition: one change at a time" + ("" if primary else " (secondary: no verdicts)") + "\n",
        PRIMARY if primary else SECONDARY,
        markdown_table(titles, rows, "llr" + COMPARISON_ALIGN),
    ]
    family = significance.family_size([c.p for c in tests.values()], len(contrasts))
    lines.append(f"\n{fill('contrasts', family=family, detectable=detectable_text(family, 'these comparisons'))}\n")
    return "\n".join(lines) + "\n"


PER_SEED = [
    ("scored step", "step", "{:,d}"),
    ("dev loss", "dev_loss", "{:.3f}"),
    ("dev PPL", "dev_perplexity", "{:.2f}"),
    ("dev BLEU", "dev_bleu", "{:.2f}"),
    ("test PPL", "test_perplexity", "{:.2f}"),
    ("test BLEU", "test_bleu", "{:.2f}"),
]


def per_seed_markdown(results: list[dict], spec: dict) -> str:
    """Every run's own numbers: seed, scored step (of the steps trained), dev and test scores, and its batch."""
    key = spec["key"]
    columns = [c for c in PER_SEED if any(c[1] in r for r in results)]
    letters = batch_letters(results)
    rows = [
        [
            r["value"],
            r["seed"],
            *(fmt.format(r[field]) if field in r else "–" for _, field, fmt in columns),
            f"{r['num_train_steps']:,}" if "num_train_steps" in r else "–",
            letters[batch_label(r)],
        ]
        for r in results
    ]
    titles = [key, "seed", *(t for t, _, _ in columns), "trained steps", "batch"]
    lines = ["## Per seed\n", markdown_table(titles, rows, "lr" + "r" * (len(columns) + 1) + "l")]
    lines.append(f"\n{fill('per_seed')}\n")
    return "\n".join(lines) + "\n"


def batch_label(result: dict) -> str:
    """The batch a run belongs to, "commit × CPU kind" ("e6da489 × AMD EPYC (no native bf16)"), from its
    result.json's `commit` (7 digits, "(dirty)" where tracked files differed) and `machine` (`machine_label`);
    "unrecorded" for either it lacks. A copied run (`shared_from`) keeps the batch it ran in."""
    commit = result.get("commit")
    code = commit[:7] + (" (dirty)" if result.get("dirty") else "") if commit else "unrecorded"
    return f"{code} × {machine_label(result.get('machine'))}"


def batch_letters(results: list[dict]) -> dict[str, str]:
    """{batch label: its letter}: A, B, ... in the order the batches first appear in `results`."""
    labels = dict.fromkeys(batch_label(r) for r in results)
    return {label: _letter(i) for i, label in enumerate(labels)}


def _letter(i: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA, ..."""
    return ("" if i < 26 else _letter(i // 26 - 1)) + chr(ord("A") + i % 26)


def batches_markdown(results: list[dict], spec: dict) -> str:
    """Which batch (commit × CPU kind) ran which of the sweep's seeds (`batches_legend`)."""
    groups = {value: [r for r in results if r["value"] == value] for value in spec["values"]}
    return batches_legend(groups, spec["key"], batch_letters(results))


def batches_legend(groups: dict[object, list[dict]], key: str, letters: dict[str, str]) -> str:
    """Which batch (commit × CPU kind) ran which seeds of each point (`groups`: point -> its runs): the legend of
    `letters` (`batch_letters`), as the per-seed and the sensitivity tables use them."""
    runs: dict[str, dict] = {}
    for point, point_runs in groups.items():
        for r in sorted(point_runs, key=lambda r: r["seed"]):
            runs.setdefault(batch_label(r), {}).setdefault(point, []).append(r["seed"])
    rows = [
        [letter, label, "; ".join(f"{point}: {', '.join(map(str, seeds))}" for point, seeds in runs[label].items())]
        for label, letter in letters.items()
        if label in runs
    ]
    lines = ["## Batches\n", markdown_table(["batch", "commit × CPU kind", f"runs ({key}: seeds)"], rows)]
    lines.append(f"\n{fill('batches')}\n")
    return "\n".join(lines) + "\n"


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


def seed_batches(runs: list[dict], letters: dict[str, str]) -> list[str]:
    """The batch letter of each run, in seed order."""
    return [letters[batch_label(r)] for r in sorted(runs, key=lambda r: r["seed"])]


def crosses_batches(runs: list[dict]) -> bool:
    """Whether `runs` (both sides of a comparison) ran in more than one batch."""
    return len({batch_label(r) for r in runs}) > 1


def ci_cell(c) -> str:
    """A comparison's interval [low, high] ("–" where it has none)."""
    return "–" if math.isnan(c.ci_low) else f"[{c.ci_low:+.2f}, {c.ci_high:+.2f}]"


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


def batch_summary(comparisons: dict[str, tuple], groups: dict[object, list[dict]]) -> str:
    """One line: which comparisons (those with seeds on both sides) ran within one batch, which crossed."""
    ready = {label: pair for label, pair in comparisons.items() if all(groups.get(side) for side in pair)}
    split = {
        flag: [label for label, (a, b) in ready.items() if crosses_batches(groups[a] + groups[b]) == flag]
        for flag in (False, True)
    }
    return fill("batch_summary", within="; ".join(split[False]) or "none", crossing="; ".join(split[True]) or "none")


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


PER_SEED_FIELDS = (
    "step",
    "dev_bleu",
    "test_bleu",
    "dev_perplexity",
    "test_perplexity",
)  # labelled per-seed CSV columns


def aggregate(results: list[dict], p_values: dict | None = None) -> list[dict]:
    """One row per swept value: the fields every seed agrees on, `_mean`/`_std` of every number, per-seed
    columns (`test_bleu_seed1`, `step_seed1`, ...; `p_seed1` where a per-pair p is given), and `p_values`
    (against the reference point, seed pair by seed pair: a list, or {seed: p})."""
    rows = []
    for value in dict.fromkeys(r["value"] for r in results):
        runs = sorted((r for r in results if r["value"] == value), key=lambda r: r.get("seed", 0))
        # a field whose seeds differ (step, test_bleu, seed) is never shown as one value: it would be seed 0's;
        # the per-seed fields are only per seed, even where the seeds agree
        row = {k: v for k, v in runs[0].items() if k not in PER_SEED_FIELDS and all(r.get(k) == v for r in runs)}
        row |= {"value": value, "seeds": len(runs)}
        for field, first in runs[0].items():
            if isinstance(first, float):
                values = [r[field] for r in runs]
                row[f"{field}_mean"] = statistics.fmean(values)
                row[f"{field}_std"] = statistics.stdev(values) if len(values) > 1 else float("nan")
        for field in PER_SEED_FIELDS:
            for r in runs:
                if field in r and "seed" in r:
                    row[f"{field}_seed{r['seed']}"] = r[field]
        row["commits"] = (
            ", ".join(
                dict.fromkeys(
                    r["commit"][:10]
                    + (" (dirty)" if r["dirty"] else "")
                    + (f" (run of {r['shared_from'].rsplit('/', 1)[0]})" if "shared_from" in r else "")
                    for r in runs
                    if "commit" in r
                )
            )
            or "–"
        )
        row["machines"] = machines(runs)
        if p_values and value in p_values:
            given = p_values[value]
            row["p_values"] = list(given.values()) if isinstance(given, dict) else list(given)
            if isinstance(given, dict):
                row.update({f"p_seed{seed}": p for seed, p in given.items()})
        rows.append(row)
    return rows


def machines(runs: list[dict]) -> str:
    """Which machines evaluated a row's runs, with counts ("AMD EPYC × 2, unrecorded × 1"): its speed
    columns average over them, and speeds compare only within one machine."""
    labels = [machine_label(r.get("machine")) for r in runs]
    return ", ".join(f"{label} × {labels.count(label)}" for label in dict.fromkeys(labels))


def machine_label(key: str | None) -> str:
    """A result's `machine` (precision.machine_key: "cpu|cpu|MODEL, BF16|jax ..|jaxlib ..") as its device, or
    its CPU model and bfloat16 support: one model name covers CPUs that differ ~2x (a Zen 3 and a Zen 4 EPYC)."""
    if not key:
        return "unrecorded"
    platform, kind, *rest = key.split("|")
    if platform != "cpu" or not rest:
        return kind
    model, _, bf16 = rest[0].rpartition(", ")
    return f"{model} ({bf16})" if model else rest[0]


def markdown(rows: list[dict], spec: dict) -> str:
    key, reference = spec["key"], spec["reference"]
    columns = [c for c in COLUMNS.get(key, HEADS) if any(c[1] in row or f"{c[1]}_mean" in row for row in rows)]
    paper = key in ("h", "dk")
    p_title = f"per seed pair: test BLEU p vs {key}={reference}'s same seed (secondary; two-sided paired randomization)"
    titles = (
        [t for t, _, _ in columns]
        + (["paper dev PPL", "paper dev BLEU"] if paper else [])
        + [p_title, "seeds", "commits", "machines"]
    )
    table = []
    for row in rows:
        cells = []
        for _, field, fmt in columns:
            if field in SPREAD_FIELDS:
                std = row[field + "_std"]  # nan with one seed
                cells.append(fmt.format(row[field + "_mean"]) + (f" ± {fmt.format(std)}" if math.isfinite(std) else ""))
            else:
                cells.append(fmt.format(row[field + "_mean"] if f"{field}_mean" in row else row[field]))
        if paper:
            cells += [f"{x}" for x in paper_numbers(key, row) or ("–", "–")]
        cells.append(
            "reference" if row["value"] == reference else " / ".join(_pair_p(p) for p in row.get("p_values", [])) or "–"
        )
        cells.append(str(row["seeds"]))
        cells.append(row["commits"])
        cells.append(row["machines"])
        table.append(cells)
    note = fill("means", trials=f"{significance.AR_TRIALS:,}", key=key, reference=reference)
    return f"{markdown_table(titles, table)}\n\n{note}\n"


def curves_markdown(run_curves: list[tuple[int | str, curves.Curve]], spec: dict) -> str:
    """The dev-curve section: final dev loss, the last 20 % of steps' perplexity gain, steps to a common dev loss."""
    run_curves = [(value, curve) for value, curve in run_curves if len(curve) >= 2]
    if not run_curves:
        return ""
    key, reference = spec["key"], spec["reference"]
    target = max(curve[-1][1] for _, curve in run_curves)  # the worst run's final loss: every run reaches it
    per_value: dict[int, dict[str, list]] = {}
    for value, curve in run_curves:
        entry = per_value.setdefault(value, {"final": [], "tail": [], "steps": []})
        entry["final"].append(curve[-1][1])
        entry["tail"].append(curves.tail_improvement(curve))
        entry["steps"].append(curves.steps_to_loss(curve, target))
    mean = statistics.fmean
    spread = lambda xs, fmt: f" ± {statistics.stdev(xs):{fmt}}" if len(xs) > 1 else ""  # in its mean's format
    reference_steps = mean(per_value[reference]["steps"]) if reference in per_value else None
    titles = [key, "final dev loss", "dev PPL gain over the last 20 % of steps", f"steps to dev loss {target:.3f}"]
    titles += [f"÷ {key}={reference}'s", "runs"]
    rows = []
    for value, entry in per_value.items():
        steps = mean(entry["steps"])
        rows.append(
            [
                value,
                f"{mean(entry['final']):.3f}{spread(entry['final'], '.3f')}",
                f"{100 * mean(entry['tail']):.2f} %{spread([100 * t for t in entry['tail']], '.2f')}",
                f"{steps:,.0f}{spread(entry['steps'], ',.0f')}",
                f"{steps / reference_steps:.2f}" if reference_steps else "–",
                len(entry["final"]),
            ]
        )
    lines = [
        f"\n## Dev curves ({evaluation_cadence([curve for _, curve in run_curves])})\n",
        markdown_table(titles, rows, "lrrrrr"),
    ]
    lines.append(f"\n{fill('curves', target=f'{target:.3f}')}\n")
    return "\n".join(lines) + "\n"


def evaluation_cadence(run_curves: list[curves.Curve]) -> str:
    """How often the runs evaluated dev loss: "evaluated every 400 steps", or, where runs differ, each cadence
    with the length of the runs that used it ("evaluated every 400 steps (runs of 4,000 steps), every 800
    (runs of 8,000)"). A run's cadence is its first two evaluations' distance, its length its last one's step."""
    lengths: dict[int, set[int]] = {}
    for curve in run_curves:
        lengths.setdefault(curve[1][0] - curve[0][0], set()).add(curve[-1][0])
    if len(lengths) == 1:
        return f"evaluated every {next(iter(lengths)):,} steps"
    parts = [
        f"{every:,}"
        + (" steps" if i == 0 else "")
        + f" (runs of {' and '.join(f'{n:,}' for n in sorted(ends))}"
        + (" steps)" if i == 0 else ")")
        for i, (every, ends) in enumerate(sorted(lengths.items()))
    ]
    return "evaluated every " + ", every ".join(parts)


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


def write_csv(rows: list[dict], path: Path) -> None:
    skip = ("point", "seed", "bleu_signature", "commit", "dirty", "machine", "p_values")
    fields = [k for row in rows for k in row if k not in skip]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(fields)), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


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
