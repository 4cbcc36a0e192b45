"""Which batch (commit × machine) ran each run of a sweep: the batches' labels and letters, their legend, the
per-seed table that lists every run with its batch, and whether a comparison's runs cross batches.
"""

from __future__ import annotations

from sweeps.tables.prose import fill
from training.core.markdown import markdown_table

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


def seed_batches(runs: list[dict], letters: dict[str, str]) -> list[str]:
    """The batch letter of each run, in seed order."""
    return [letters[batch_label(r)] for r in sorted(runs, key=lambda r: r["seed"])]


def crosses_batches(runs: list[dict]) -> bool:
    """Whether `runs` (both sides of a comparison) ran in more than one batch."""
    return len({batch_label(r) for r in runs}) > 1


def batch_summary(comparisons: dict[str, tuple], groups: dict[object, list[dict]]) -> str:
    """One line: which comparisons (those with seeds on both sides) ran within one batch, which crossed."""
    ready = {label: pair for label, pair in comparisons.items() if all(groups.get(side) for side in pair)}
    split = {
        flag: [label for label, (a, b) in ready.items() if crosses_batches(groups[a] + groups[b]) == flag]
        for flag in (False, True)
    }
    return fill("batch_summary", within="; ".join(split[False]) or "none", crossing="; ".join(split[True]) or "none")
