"""Compile a config's programs for a TPU or GPU this machine does not have, and say whether they fit.

    pip install -c requirements.lock -e ".[aot]"       # libtpu and the CUDA plugin, pinned to the locked jax
    python -m bench.aot --config configs/default.py --target tpu:v5e:2x2 --mesh 2,2
    python -m bench.aot --config configs/base.py --config.model.dtype=bfloat16 --target tpu:v5e --json aot.json
    python -m bench.aot --config configs/base.py --target cuda:h100 --programs train
    python -m bench.aot --config configs/base.py --target tpu:v5e --largest_rows --seed_rows 64,96

--target tpu:CHIP[:TOPOLOGY] (CHIP: v4, v5e, v5p, v6e; TOPOLOGY chips a side, one chip by default) or
cuda:GPU[:COUNT] (GPU: h100, h200; GPU targets also need CUDA's ptxas and nvlink on the PATH, and
their figures are the program before autotuning: training/run/aot/compiled.py says what that route cannot show);
--mesh DATA,MODEL (default: every device on data); --programs some of train,eval,decode,beam (default:
all four). The train step (the run's own `MeshTrainer.step_fn`, over the mesh), the eval step, one
decode step (its KV cache at the full decode length) and the whole beam search (eval.py's beam size,
4) are compiled at the config's shapes, the last three on one device as a run evaluates
(`training.run.aot`): per device, argument / output / temp memory and what the program needs in
all, its share of the chip's HBM, FLOPs (XLA's cost analysis), collectives by kind, fusions and
custom calls, and the seconds to lower and compile on this CPU. A program that does not fit is
refused in one line on stderr (exit status 1) after the table and JSON are written. The model's
hooks and `model.dtype = "auto"` are chosen for the target, never for this CPU.

--largest_rows: instead, the most training rows (a multiple of --granularity, 8) whose train step
fits a device (`aot.largest_rows`): the train step compiled at the two --seed_rows, a line through
their memory, the largest multiple it predicts to fit compiled with the next one above, and a
bisection only where those two disagree with the line. Each compile is printed as it finishes.
--without_remat: a train step XLA rematerialised (recomputing values to make room) does not fit either.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # read when JAX is imported: the host compiles, no TPU backend is tried

import json
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from bench.lib import releases
from training.core import errors
from training.core.markdown import markdown_table
from training.run import aot

config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:args])", lock_config=True)
flags.DEFINE_string(
    "target", None, "tpu:CHIP[:TOPOLOGY] or cuda:GPU[:COUNT], e.g. tpu:v5e:2x2, tpu:v4:2x2x1, cuda:h100"
)
flags.DEFINE_string("mesh", "-1,1", "DATA,MODEL shards of the train step's mesh (-1: the rest of the devices)")
flags.DEFINE_integer("rows", None, "the global training batch's rows (default: the config's, token_budget // length)")
flags.DEFINE_string("programs", ",".join(aot.PROGRAMS), f"which programs to compile, some of {aot.PROGRAMS}")
flags.DEFINE_string("json", None, "also write the report here as JSON")
flags.DEFINE_bool(
    "largest_rows", False, "search the most training rows whose train step fits a device (aot.largest_rows)"
)
flags.DEFINE_string(
    "seed_rows",
    None,
    "--largest_rows: LO,HI, the two row counts whose memory seeds the search's line, "
    "multiples of --granularity (default: half the config's rows and its rows, rounded down)",
)
flags.DEFINE_integer("granularity", aot.ROWS_GRANULARITY, "--largest_rows: the rows it steps by")
flags.DEFINE_bool(
    "without_remat",
    False,
    "--largest_rows: a train step XLA rematerialised (recomputes values to make room) does not fit either",
)
flags.DEFINE_float(
    "hbm_fraction",
    1.0,
    "--largest_rows: the share of a device's HBM the train step may need (0.75: "
    "what a JAX process allocates of a GPU by default, XLA_PYTHON_CLIENT_MEM_FRACTION)",
)
flags.mark_flags_as_required(["config", "target"])

MIB = 2**20


def table(reports: dict) -> str:
    """The report as a Markdown table, one row a program (memory in MiB a device)."""
    rows = []
    for name, r in reports.items():
        m = {k: v / MIB for k, v in r["memory_bytes"].items()}
        mesh = " x ".join(f"{k} {v}" for k, v in r["mesh"].items()) or "unsharded"
        found = ", ".join(f"{op} {n}" for op, n in r["collectives"].items() if n) or "none"
        flops = "n/a" if r["flops"] is None else f"{r['flops'] / 1e9:,.1f}"
        batch = (
            f"{r['batch'][0]} x {r['batch'][1]}"
            + (f" -> {r['max_len']}" if "max_len" in r else "")
            + (f", beam {r['beam_size']}" if "beam_size" in r else "")
        )
        mib = [f"{m[k]:,.1f}" for k in ("argument", "output", "temp", "generated_code", "needed")]
        rows.append(
            [name, f"{r['devices']} ({mesh})", batch, *mib, f"{100 * r['hbm_share']:.1f} %", flops, found]
            + [r["fusions"], r["custom_calls"], f"{r['lower_s']:.1f}", f"{r['compile_s']:.1f}"]
        )
    titles = ["program", "devices (mesh)", "batch", "argument", "output", "temp", "code", "needs", "of HBM"]
    titles += ["GFLOP / device", "collectives", "fusions", "custom calls", "lower s", "compile s"]
    return (
        "memory in MiB a device; needs = argument + output - donated + temp + code; batch: rows x length, "
        "decode and beam: sources rows x length -> output tokens (the decode step's cache positions)\n\n"
        + markdown_table(titles, rows, "lll" + "r" * 7 + "l" + "r" * 4)
    )


def searched(result: dict) -> str:
    """A largest-rows search as a Markdown table, one row a compile in order, and its answer."""
    gib = 2**30
    rows = []
    for c in result["compiles"]:
        needs = "refused" if c["needed_bytes"] is None else f"{c['needed_bytes'] / gib:.2f}"
        seconds = "" if c["compile_s"] is None else f"{c['compile_s']:.1f}"
        remat = "" if c["rematerialized"] is None else c["rematerialized"]
        rows.append([c["rows"], c["stage"], needs, "yes" if c["fits"] else "no", remat, seconds])
    titles = ["rows", "stage", "needs GiB", "fits", "rematerialized", "compile s"]
    lines = [
        markdown_table(titles, rows, "rlrlrr"),
        "",
        "rematerialized: instructions XLA cloned to recompute a value instead of holding it (aot.hlo_counts)",
    ]
    if result["line"] is not None:
        a, b = result["line"]
        lines += [
            "",
            f"line through the seeds: needs = {a / gib:.3f} GiB + {b / 2**20:.2f} MiB x rows; "
            f"predicts {result['predicted']} rows (multiples of {result['granularity']})",
        ]
    answer = (
        f"largest rows: {result['rows']} ({result['needed_bytes'] / gib:.2f} GiB of {result['hbm_bytes'] / gib:.4g})"
        if result["rows"]
        else f"largest rows: none ({result['granularity']} rows do not fit)"
    )
    answer += aot.shrinks_note(result["shrinks"])
    return "\n".join([*lines, "", f"{answer}; {len(result['compiles'])} compiles"])


def _largest_rows(config, target, data: int, model: int) -> dict:
    granularity = flags.FLAGS.granularity
    if flags.FLAGS.seed_rows:
        try:
            lo, hi = (int(x) for x in flags.FLAGS.seed_rows.split(","))
        except ValueError:
            raise ValueError(
                f"--seed_rows = {flags.FLAGS.seed_rows!r}; expected LO,HI as two ints, e.g. 64,96"
            ) from None
    else:
        rows, _ = aot.train_shape(config)
        hi = max(2 * granularity, rows // granularity * granularity)
        lo = max(granularity, hi // 2 // granularity * granularity)
    fraction = flags.FLAGS.hbm_fraction
    share = (
        f"{fraction:g} x {target.chip.hbm_gib:g} = {fraction * target.chip.hbm_gib:.1f}"
        if fraction != 1
        else f"{target.chip.hbm_gib:g}"
    )
    remat = ", XLA rematerialising nothing" if flags.FLAGS.without_remat else ""
    print(
        f"train step, rows in multiples of {granularity}; fits: needs <= {share} GiB{remat} "
        "(XLA refusing it: does not fit)",
        flush=True,
    )

    def show(entry):
        needs = "refused" if entry["needed_bytes"] is None else f"{entry['needed_bytes'] / 2**30:.2f} GiB"
        print(
            f"  {entry['stage']} rows {entry['rows']}: needs {needs}, {'fits' if entry['fits'] else 'does not fit'}"
            + (f" ({entry['why']})" if entry["why"] else ""),
            flush=True,
        )

    return aot.largest_rows(
        config,
        target,
        lo,
        hi,
        granularity,
        data,
        model,
        on_compile=show,
        hbm_fraction=fraction,
        without_remat=flags.FLAGS.without_remat,
    )


def main(argv):
    del argv
    target = aot.parse_target(flags.FLAGS.target)
    data, model = aot.parse_mesh(flags.FLAGS.mesh)
    programs = tuple(p for p in flags.FLAGS.programs.split(",") if p)
    config = flags.FLAGS.config
    compiler = "libtpu" if target.chip.platform == "tpu" else "jax-cuda13-plugin"
    header = (
        f"{target.name}: {target.num_devices} device(s), {target.chip.hbm_gib:g} GiB HBM each "
        f"({aot.HBM_SOURCES[target.chip.platform]}); compiled on this CPU, {compiler} {_version(compiler)}{releases()}"
    )
    print(header, flush=True)
    if flags.FLAGS.largest_rows:
        if flags.FLAGS.rows is not None:
            raise ValueError("--rows and --largest_rows: give one (the search chooses the rows)")
        result = _largest_rows(config, target, data, model)
        print(searched(result))
        if flags.FLAGS.json:
            Path(flags.FLAGS.json).write_text(json.dumps({"header": header, "largest_rows": result}, indent=2))
        return
    reports = aot.compile_programs(config, target, data, model, rows=flags.FLAGS.rows, programs=programs)
    print(table(reports))
    if flags.FLAGS.json:
        Path(flags.FLAGS.json).write_text(json.dumps({"header": header, "programs": reports}, indent=2))
    refused = [line for name, r in reports.items() if (line := aot.refusal(name, r))]
    if refused:
        raise errors.RunRefused("; ".join(refused))


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


if __name__ == "__main__":
    errors.run_reporting_user_errors("bench.aot", lambda: app.run(main))
