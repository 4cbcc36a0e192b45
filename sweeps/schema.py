"""A sweep config module: its names checked (`load_module`), its variants, and the points and seeds it defines.

A sweep config module (e.g. configs/ablation_heads.py) is an ordinary config whose argument
`KEY=VALUE` selects a point, plus five names: `SWEEP_NAME` (the results' name), `SWEEP_KEY`,
`SWEEP_VALUES` (positive ints, or names such as attention types), `SWEEP_REFERENCE` (the value
every point is compared with) and `SWEEP_TEST_SPLIT` (a held-out split also scored, or None). A
point trains in WORKDIR/KEYVALUE_seedK (KEY_VALUE_seedK for a name; checkpoints,
logs); once evaluated, its small files go to RESULTS_DIR/NAME/ (sweeps/store.py), and a
point whose result.json is there is finished, on whichever machine that directory is checked out.
All points share one SentencePiece vocabulary (RESULTS_DIR/NAME/spm.model), so the only
differences are the swept field and the seed.

Optional names: `SWEEP_SHARED` and `SWEEP_SHARED_REFERENCE`, the points that are another sweep's
runs (sweeps/adopt.py); `SWEEP_CONTRASTS = ((label, FROM_VALUE, TO_VALUE), ...)`, comparisons between
its points besides each against the reference, which `sweep.py collect` gives their own seed-level
table (the head-size sweep's decomposition).

A sweep config may offer variants of every point, `SWEEP_VARIANTS = ("packed",)` (the Table 3
sweeps: configs/table3_preset.py): `--config PATH:packed` runs each point with its argument
`KEY=VALUE,packed` and stores it under SWEEP_NAME_packed, apart from the plain points (`variant`).

Seeds are 0, 1, ... unless the config names its first, `SWEEP_FIRST_SEED = K` (seeds K, K + 1, ...):
a replication draws seeds no earlier run used, since a seed fixes the data order and the
initialisation (configs/head_size_blocked.py).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from sweeps import store

SWEEP_NAMES = ("SWEEP_NAME", "SWEEP_KEY", "SWEEP_VALUES", "SWEEP_REFERENCE", "SWEEP_TEST_SPLIT", "get_config")


@dataclasses.dataclass(frozen=True)
class Point:
    key: str
    value: int | str
    seed: int

    @property
    def name(self) -> str:
        """The point's workdir (and log) name."""
        return f"{store.point_label(self.key, self.value)}_seed{self.seed}"

    @property
    def arg(self) -> str:
        return f"{self.key}={self.value}"


@dataclasses.dataclass(frozen=True)
class Stack:
    """Seeds of one point trained as one program (`sweep.py run --stack_seeds S`): one job, one process."""

    points: tuple[Point, ...]

    @property
    def name(self) -> str:
        """The stack's workdir (and log) name: the point's label and its seeds."""
        first = self.points[0]
        return f"{store.point_label(first.key, first.value)}_seeds{'-'.join(str(p.seed) for p in self.points)}"

    @property
    def arg(self) -> str:
        return self.points[0].arg

    @property
    def seeds(self) -> list[int]:
        return [p.seed for p in self.points]


def stacks(points: list[Point], size: int) -> list[Stack]:
    """`points` as stacks of at most `size` seeds of one point each, in order (a point's last stack may be smaller)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"--stack_seeds must be a positive int, got {size!r}")
    by_point: dict[str, list[Point]] = {}
    for point in points:
        by_point.setdefault(point.arg, []).append(point)
    return [
        Stack(tuple(seeds[start : start + size])) for seeds in by_point.values() for start in range(0, len(seeds), size)
    ]


def import_file(config_path: str | Path, flag: str = "--config") -> ModuleType:
    """The Python module at `config_path` (a config file, not a package module)."""
    path = Path(config_path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {config_path}: no such file")
    spec = importlib.util.spec_from_file_location(f"sweep_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_module(config_path: str | Path) -> ModuleType:
    """The sweep config module at `config_path` (PATH, or PATH:VARIANT: `variant`), checked for the sweep names
    and their values."""
    path, _, variant_name = str(config_path).partition(":")
    module = import_file(path)
    missing = [n for n in SWEEP_NAMES if not hasattr(module, n)]
    if missing:
        raise ValueError(f"{path} is not a sweep config: it lacks {', '.join(missing)}")
    module = variant(module, variant_name, path) if variant_name else module
    _check(config_path, module)
    return module


def variant(module: ModuleType, name: str, path: str | Path) -> ModuleType:
    """The sweep `module` (a fresh import, changed in place) as its variant `name`, one of its `SWEEP_VARIANTS`
    (the Table 3 sweeps' "packed": configs/table3_preset.py): every point's config argument gains ",NAME"
    (h=8 -> h=8,packed), its results are stored apart, as SWEEP_NAME_NAME, and its shared points are the
    same variant's of the other sweeps (a variant's points compare with that variant's only)."""
    offered = tuple(getattr(module, "SWEEP_VARIANTS", ()))
    if name not in offered:
        raise ValueError(f"--config {path}:{name}: {path} offers the variants {offered} (SWEEP_VARIANTS)")
    get_config = module.get_config
    module.get_config = lambda arg=None: get_config(f"{arg},{name}" if arg else name)
    module.SWEEP_NAME = f"{module.SWEEP_NAME}_{name}"
    if getattr(module, "SWEEP_SHARED_REFERENCE", None) is not None:
        origin, value = module.SWEEP_SHARED_REFERENCE
        module.SWEEP_SHARED_REFERENCE = (f"{origin}_{name}", value)
    if getattr(module, "SWEEP_SHARED", None):
        module.SWEEP_SHARED = {v: (f"{origin}_{name}", value) for v, (origin, value) in module.SWEEP_SHARED.items()}
    return module


def _check(config_path, module: ModuleType) -> None:
    def bad(name, expected):
        return ValueError(f"{config_path}: {name} = {getattr(module, name)!r}; expected {expected}")

    if not isinstance(module.SWEEP_NAME, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", module.SWEEP_NAME):
        raise bad("SWEEP_NAME", "a name of letters, digits, '_' and '-' (it names results/NAME/)")
    if not isinstance(module.SWEEP_KEY, str) or not re.fullmatch(r"[A-Za-z_]+", module.SWEEP_KEY):
        raise bad("SWEEP_KEY", "the config argument's key, letters and '_' only (e.g. 'h')")
    values = module.SWEEP_VALUES
    if (
        not isinstance(values, (tuple, list))
        or not values
        or len(set(values)) != len(values)
        or not (all(map(_is_count, values)) or all(map(_is_name, values)))
    ):
        raise bad(
            "SWEEP_VALUES",
            "a non-empty tuple of distinct positive ints, or of distinct names (lower-case letters, digits, '_')",
        )
    if module.SWEEP_REFERENCE not in values:
        raise bad("SWEEP_REFERENCE", f"one of SWEEP_VALUES {tuple(values)}")
    if module.SWEEP_TEST_SPLIT is not None and not isinstance(module.SWEEP_TEST_SPLIT, str):
        raise bad("SWEEP_TEST_SPLIT", "a split name or None")

    def is_origin(shared):
        return (
            isinstance(shared, tuple)
            and len(shared) == 2
            and isinstance(shared[0], str)
            and re.fullmatch(r"[A-Za-z0-9_-]+", shared[0]) is not None
            and shared[0] != module.SWEEP_NAME
            and (_is_count(shared[1]) or _is_name(shared[1]))
        )

    shared = getattr(module, "SWEEP_SHARED_REFERENCE", None)
    if shared is not None and not is_origin(shared):
        raise bad(
            "SWEEP_SHARED_REFERENCE",
            "None or (another sweep's SWEEP_NAME, its value that is the same run as SWEEP_REFERENCE)",
        )
    many = getattr(module, "SWEEP_SHARED", None)
    if many is not None and not (isinstance(many, dict) and all(v in values and is_origin(o) for v, o in many.items())):
        raise bad(
            "SWEEP_SHARED",
            "None or {a value of SWEEP_VALUES: (another sweep's SWEEP_NAME, its value that is the same run)}",
        )
    if many and shared is not None and module.SWEEP_REFERENCE in many and many[module.SWEEP_REFERENCE] != shared:
        raise bad("SWEEP_SHARED", f"an origin of SWEEP_REFERENCE that agrees with SWEEP_SHARED_REFERENCE {shared!r}")
    contrasts = getattr(module, "SWEEP_CONTRASTS", ())
    if not (
        isinstance(contrasts, tuple)
        and all(
            isinstance(c, tuple)
            and len(c) == 3
            and isinstance(c[0], str)
            and c[0]
            and c[1] in values
            and c[2] in values
            and c[1] != c[2]
            for c in contrasts
        )
    ):
        raise bad("SWEEP_CONTRASTS", "a tuple of (label, a value of SWEEP_VALUES, another value of SWEEP_VALUES)")
    first = getattr(module, "SWEEP_FIRST_SEED", 0)
    if not isinstance(first, int) or isinstance(first, bool) or first < 0:
        raise bad("SWEEP_FIRST_SEED", "an int >= 0, the sweep's first seed")
    registration = getattr(module, "SWEEP_PREREGISTRATION", None)
    if registration is not None and not (isinstance(registration, str) and registration.endswith(".md") and contrasts):
        raise bad(
            "SWEEP_PREREGISTRATION",
            "None or the committed .md file that registered the analysis of SWEEP_CONTRASTS (which it needs)",
        )


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_name(value) -> bool:
    """A categorical sweep value, such as an attention type."""
    return isinstance(value, str) and re.fullmatch(r"[a-z][a-z0-9_]*", value) is not None


def shared_points(module: ModuleType) -> dict[int | str, tuple[str, int | str]]:
    """{value: (other sweep's name, its value)} for every point that is another sweep's run."""
    shared = dict(getattr(module, "SWEEP_SHARED", None) or {})
    if getattr(module, "SWEEP_SHARED_REFERENCE", None) is not None:
        shared.setdefault(module.SWEEP_REFERENCE, module.SWEEP_SHARED_REFERENCE)
    return shared


def points(module: ModuleType, seeds: int) -> list[Point]:
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ValueError(f"--seeds must be a positive int, got {seeds!r}")
    first = getattr(module, "SWEEP_FIRST_SEED", 0)
    # Seed-major: a sweep cut short has every value once before it has any twice.
    return [
        Point(module.SWEEP_KEY, value, seed) for seed in range(first, first + seeds) for value in module.SWEEP_VALUES
    ]


def sweep_dir(results_dir: str | Path, module: ModuleType) -> Path:
    return Path(results_dir) / module.SWEEP_NAME


def parse_point(arg: str, seed: int, module: ModuleType) -> Point:
    """The point `--point KEY=VALUE --seed K` names, checked against the sweep config."""
    key, _, text = arg.partition("=")
    value = int(text) if text.isdigit() else text
    if key != module.SWEEP_KEY or value not in module.SWEEP_VALUES:
        raise ValueError(f"--point {arg!r}: expected {module.SWEEP_KEY}=<one of {tuple(module.SWEEP_VALUES)}>")
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    return Point(key, value, seed)


def write_spec(results_dir: Path, config_path: str, module: ModuleType, seeds: int) -> None:
    """What `sweep.py collect` needs besides the points' files: the swept values and the reference point."""
    spec = {
        "config": str(config_path),
        "name": module.SWEEP_NAME,
        "key": module.SWEEP_KEY,
        "values": list(module.SWEEP_VALUES),
        "reference": module.SWEEP_REFERENCE,
        "test_split": module.SWEEP_TEST_SPLIT,
        "seeds": seeds,
        "contrasts": [list(c) for c in getattr(module, "SWEEP_CONTRASTS", ())],
    }
    store.write_spec(sweep_dir(results_dir, module), spec)
