"""The stacked-seed check read back: the same seeds of one point trained alone and stacked, side by side.

    python -m bench.stacked_cpu --alone runs/stacked_check/alone --stacked runs/stacked_check/stacked \
        --alone_runs runs/stacked_check/alone_runs --stacked_runs runs/stacked_check/stacked_runs \
        [--alone_time runs/compare/alone.log --stacked_time runs/compare/stacked.log] [--copy results/stacked_check]

Reads each side's stored results (`sweep.py run --results_dir`, configs/stacked_check.py's sweep) and point
logs, and prints two tables: per seed, the dev and test scores alone and stacked and their difference; per
side, the wall time (the sweep's, from `/usr/bin/time -v` when its output is given, and the training's from
train_seconds), the programs each process compiled or loaded from the persistent cache (its training's log
line "compilation in this invocation"), and the peak resident memory of the largest process. `--copy` keeps
each seed's result.json under DIR/{alone,stacked}/seedK.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from training.core.markdown import markdown_table

SWEEP = "stacked_check"
COMPILES = re.compile(
    r"compilation in this invocation: (\d+) programs compiled in ([\d.]+)s, (\d+) loaded from the persistent cache"
)


def results(results_dir: Path) -> dict[int, dict]:
    """{seed: result.json} of the check's one point."""
    found = sorted((results_dir / SWEEP).glob("h*/seed*/result.json"))
    return {json.loads(p.read_text())["seed"]: json.loads(p.read_text()) for p in found}


def compiles(runs: Path) -> tuple[int, int, float]:
    """(programs compiled, programs loaded from the cache, compile seconds) over every point log of a side's
    training (each process logs its training's count once)."""
    compiled = loaded = 0
    seconds = 0.0
    for log in sorted(runs.glob("*.log")):
        for match in COMPILES.finditer(log.read_text(errors="replace")):
            compiled, seconds, loaded = compiled + int(match[1]), seconds + float(match[2]), loaded + int(match[3])
    return compiled, loaded, seconds


def time_v(path: Path | None) -> tuple[float | None, float | None]:
    """(wall seconds, peak resident GiB of the largest process) from `/usr/bin/time -v`'s report."""
    if path is None or not path.is_file():
        return None, None
    text = path.read_text(errors="replace")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    seconds = None
    if wall:
        parts = [float(x) for x in wall[1].split(":")]
        seconds = sum(x * 60**i for i, x in enumerate(reversed(parts)))
    return seconds, (int(peak[1]) / 2**20 if peak else None)


def seed_table(alone: dict[int, dict], stacked: dict[int, dict]) -> str:
    rows = []
    for seed in sorted(alone.keys() & stacked.keys()):
        a, s = alone[seed], stacked[seed]
        rows.append(
            [
                seed,
                *(f"{x:.2f}" for x in (a["test_bleu"], s["test_bleu"], s["test_bleu"] - a["test_bleu"])),
                *(f"{x:.2f}" for x in (a["dev_bleu"], s["dev_bleu"], s["dev_bleu"] - a["dev_bleu"])),
                *(f"{x:.4f}" for x in (a["dev_loss"], s["dev_loss"], s["dev_loss"] - a["dev_loss"])),
            ]
        )
    titles = [
        "seed",
        "test BLEU alone",
        "stacked",
        "stacked - alone",
        "dev BLEU alone",
        "stacked",
        "stacked - alone",
        "dev loss alone",
        "stacked",
        "stacked - alone",
    ]
    return markdown_table(titles, rows, "r" * len(titles))


def side_table(sides: list[tuple[str, dict[int, dict], Path, Path | None]]) -> str:
    rows = []
    for name, found, runs, timing in sides:
        wall, peak = time_v(timing)
        compiled, loaded, seconds = compiles(runs)
        train = (
            sum(r["train_seconds"] for r in found.values())
            if name == "alone"
            else max(r["train_seconds"] for r in found.values())
        )
        rows.append(
            [
                name,
                len(found),
                "" if wall is None else f"{wall / 60:.1f}",
                f"{train / 60:.1f}",
                compiled,
                loaded,
                f"{seconds:.0f}",
                "" if peak is None else f"{peak:.2f}",
            ]
        )
    titles = [
        "side",
        "seeds",
        "wall min (sweep)",
        "train min",
        "programs compiled (training)",
        "loaded from cache",
        "compile s",
        "peak RSS GiB",
    ]
    return markdown_table(titles, rows, "lrrrrrrr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for side in ("alone", "stacked"):
        parser.add_argument(f"--{side}", type=Path, required=True, help=f"the {side} side's --results_dir")
        parser.add_argument(f"--{side}_runs", type=Path, required=True, help=f"the {side} side's --workdir")
        parser.add_argument(f"--{side}_time", type=Path, help=f"/usr/bin/time -v's output for the {side} sweep")
    parser.add_argument("--copy", type=Path, help="keep each seed's result.json under DIR/{alone,stacked}/")
    args = parser.parse_args()
    alone, stacked = results(args.alone), results(args.stacked)
    print(seed_table(alone, stacked))
    print()
    print(
        side_table(
            [
                ("alone", alone, args.alone_runs, args.alone_time),
                ("stacked", stacked, args.stacked_runs, args.stacked_time),
            ]
        )
    )
    if args.copy:
        for side, found, directory in (("alone", alone, args.alone), ("stacked", stacked, args.stacked)):
            (args.copy / side).mkdir(parents=True, exist_ok=True)
            for path in sorted((directory / SWEEP).glob("h*/seed*/result.json")):
                shutil.copyfile(path, args.copy / side / f"{path.parent.name}.json")


if __name__ == "__main__":
    main()
