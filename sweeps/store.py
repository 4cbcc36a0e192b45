"""A sweep's committed results: RESULTS_DIR/NAME/ holds everything the tables need, small enough for git.

    RESULTS_DIR/NAME/sweep.json                 what was swept (written by every start)
    RESULTS_DIR/NAME/spm.model                  the one vocabulary all points tokenise with
    RESULTS_DIR/NAME/references.SPLIT.txt       the test split's reference translations
    RESULTS_DIR/NAME/POINT/seedK/               one finished (point, seed): result.json (written last,
                                                so its presence marks the point finished), metrics.jsonl,
                                                config.json, hypotheses.SPLIT.beam4.txt (a point copied
                                                from another sweep's same run says so: `shared_from`)

Checkpoints stay in the sweep's workdir; a sweep continued on another machine from a checkout of these
files skips the finished points and trains the rest with the same vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

from training.core import files
from training.core.provenance import git_commit  # noqa: F401  (re-exported: the sweeps' name for it)

RESULT_FILE = "result.json"
SPEC_FILE = "sweep.json"
VOCABULARY_FILE = "spm.model"
RUN_FILES = ("metrics.jsonl", "config.json")  # copied from the point's workdir beside its hypotheses
REPO = Path(__file__).resolve().parents[1]


def point_dir(sweep_dir: Path, point) -> Path:
    """Where a finished `point` (a sweep.Point) keeps its files."""
    return point_path(sweep_dir, point.key, point.value, point.seed)


def point_label(key: str, value: int | str) -> str:
    """A point's directory name: key and value, joined by '_' when the value is a name ("h8", "attention_lsh")."""
    return f"{key}_{value}" if isinstance(value, str) else f"{key}{value}"


def point_path(sweep_dir: Path, key: str, value: int | str, seed: int) -> Path:
    return Path(sweep_dir) / point_label(key, value) / f"seed{seed}"


def is_finished(sweep_dir: Path, point) -> bool:
    return (point_dir(sweep_dir, point) / RESULT_FILE).exists()


def references_path(sweep_dir: Path, split: str) -> Path:
    return Path(sweep_dir) / f"references.{split}.txt"


def hypotheses_name(split: str) -> str:
    return f"hypotheses.{split}.beam4.txt"


def save_point(sweep_dir: Path, point, run_dir: Path, result: dict) -> Path:
    """Copy the finished run's small files to the point's directory, result.json last."""
    out = point_dir(sweep_dir, point)
    out.mkdir(parents=True, exist_ok=True)
    for path in [run_dir / name for name in RUN_FILES] + sorted(run_dir.glob("hypotheses.*.beam4.txt")):
        files.write_atomic(out / path.name, path.read_bytes())
    files.write_atomic(out / RESULT_FILE, json.dumps(result, indent=2))
    return out


def share_point(sweep_dir: Path, point, origin: Path, origin_name: str) -> Path:
    """Store another sweep's finished point (at `origin`, named `origin_name`) as `point`, the same run."""
    result = json.loads((origin / RESULT_FILE).read_text())
    result.update(point=point.arg, value=point.value, shared_from=origin_name)
    return save_point(sweep_dir, point, origin, result)


def write_spec(sweep_dir: Path, spec: dict) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    files.write_atomic(sweep_dir / SPEC_FILE, json.dumps(spec, indent=2))


def read_spec(sweep_dir: Path) -> dict:
    path = Path(sweep_dir) / SPEC_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: start the sweep with sweep.py run --config ... first")
    return json.loads(path.read_text())


def sweep_dirs(results_dir: Path) -> list[Path]:
    """Every sweep under `results_dir` (a directory holding sweep.json)."""
    return sorted(p.parent for p in Path(results_dir).glob(f"*/{SPEC_FILE}"))


def load_results(sweep_dir: Path, spec: dict) -> list[dict]:
    """The finished points' results, value by value in the sweep's order, seed by seed."""
    results = []
    for value in spec["values"]:  # every seed stored, whatever --seeds the latest start asked for
        seeds = sorted(int(p.name[4:]) for p in point_path(sweep_dir, spec["key"], value, 0).parent.glob("seed*"))
        for seed in seeds:
            path = point_path(sweep_dir, spec["key"], value, seed) / RESULT_FILE
            if path.exists():
                results.append(json.loads(path.read_text()))
    return results
