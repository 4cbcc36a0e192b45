"""Adoption between sweeps: a point that is another sweep's run is copied from that sweep's stored files.

A sweep whose points include runs another sweep already holds (rows B's d_k = d_v and the KV
sweep's kv = h are rows A's h = 8; the head-size sweep's h8_dk32 and h32_dk8 are rows A's h = 8 and
h = 32) says so with an optional name `SWEEP_SHARED = {VALUE: (OTHER_NAME, OTHER_VALUE), ...}`, or
`SWEEP_SHARED_REFERENCE = (OTHER_NAME, OTHER_VALUE)` for the reference point alone: the other
sweep's stored seeds are copied in as this sweep's seeds of VALUE (marked `shared_from`) instead of
being trained again, provided both sweeps tokenise with the same vocabulary (this sweep adopts the
other's when it has none yet). `adopt_shared` runs at every start of a sweep and of a point;
`adopt_stored` (`sweep.py adopt`) copies every seed the other sweeps hold, however many this one was started with.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from absl import logging

from training.core import files
from sweeps import schema, store
from sweeps.schema import Point


def adopt_shared(module: ModuleType, wanted: list[Point], results_dir: Path) -> list[Point]:
    """Store, for each point in `wanted` that another sweep already holds as the same run (`shared_points`),
    that sweep's files as this point's; return the points so stored."""
    shared = schema.shared_points(module)
    out = schema.sweep_dir(results_dir, module)
    adopted = []
    for origin_name in dict.fromkeys(name for name, _ in shared.values()):
        source = Path(results_dir) / origin_name
        if not _same_vocabulary(out, source):
            continue
        source_spec = store.read_spec(source)
        split = source_spec.get("test_split")
        if split and store.references_path(source, split).exists() and not store.references_path(out, split).exists():
            files.write_atomic(store.references_path(out, split), store.references_path(source, split).read_bytes())
        source_key = source_spec["key"]
        for point in wanted:
            if shared.get(point.value, (None,))[0] != origin_name or store.is_finished(out, point):
                continue
            origin = store.point_path(source, source_key, shared[point.value][1], point.seed)
            if (origin / store.RESULT_FILE).exists():
                store.share_point(out, point, origin, f"{origin_name}/{origin.parent.name}/{origin.name}")
                adopted.append(point)
    return adopted


def adopt_stored(module: ModuleType, results_dir: Path) -> list[Point]:
    """`adopt_shared` for every seed the other sweeps have stored of this sweep's shared points, however many
    seeds this sweep was started with: how rows A's later seeds reach the sweeps that share its runs."""
    store.read_spec(schema.sweep_dir(results_dir, module))  # a sweep never started has no spec to collect: say so here
    wanted = []
    for value, (origin_name, origin_value) in schema.shared_points(module).items():
        source = Path(results_dir) / origin_name
        if not (source / store.SPEC_FILE).exists():
            continue
        origin = source / store.point_label(store.read_spec(source)["key"], origin_value)
        seeds = sorted(int(d.name[4:]) for d in origin.glob("seed*") if d.name[4:].isdigit())
        wanted += [Point(module.SWEEP_KEY, value, seed) for seed in seeds]
    return adopt_shared(module, wanted, results_dir)


def _same_vocabulary(out: Path, source: Path) -> bool:
    """Whether sweep `out` tokenises as sweep `source` does, adopting the source's vocabulary when `out` has none."""
    vocabulary, source_vocabulary = out / store.VOCABULARY_FILE, source / store.VOCABULARY_FILE
    if not source_vocabulary.exists():
        return False
    if not vocabulary.exists():
        out.mkdir(parents=True, exist_ok=True)
        files.write_atomic(vocabulary, source_vocabulary.read_bytes())
    if vocabulary.read_bytes() != source_vocabulary.read_bytes():
        logging.warning(
            "%s and %s tokenise differently: the shared points are trained, not copied", vocabulary, source_vocabulary
        )
        return False
    return True
