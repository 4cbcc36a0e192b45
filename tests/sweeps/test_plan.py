"""`sweep.py plan`: every point of a sweep compiled for a TPU target on this CPU, nothing trained.

The tests that compile are marked slow (two TPU compiles: 82 s on a shared core here; the stacked plan's, 15-25 s
each), those that fake the compile are not. Skipped where the libtpu wheel (the `aot` extra) is absent.
"""

import io
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sweeps import plan, schema
from training.parallel import stacked
from training.run import aot

TINY = Path(__file__).with_name("tiny_sweep.py")


@pytest.mark.slow
@pytest.mark.skipif(
    not aot.has_libtpu(), reason="the libtpu wheel is absent: pip install -c requirements.lock -e '.[aot]'"
)
def test_plan_compiles_each_point_for_the_target():
    module, target = schema.load_module(TINY), aot.parse_target("tpu:v5e")
    rows = plan.plan(module, target)
    assert [r["point"] for r in rows] == ["h=1", "h=2"]
    for r in rows:
        assert r["refused"] is None and r["needs_bytes"] > 0 and r["flops"] > 0
        assert r["points_per_device"] == int(0.95 * 16 * aot.GIB // r["needs_bytes"]) > 1
    text = plan.table(rows, target)
    assert text.count("\n| h=") == 2 and "tpu:v5e:1x1 (16 GiB a device)" in text


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_plan_counts_its_compiles_on_a_bar(monkeypatch):
    # Fake compiles (a real one takes minutes for a large model): h=2 does not fit; each notes the bar as drawn.
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    seen = []

    def compile_programs(config, target, data, model, programs, devices):
        seen.append(terminal.getvalue().split("\r")[-1])
        if config == "h=2":
            raise aot.DoesNotFit("the train step needs 20.0 GiB a device; a v5e has 16")
        report = {"memory_bytes": {"needed": aot.GIB}, "hbm_share": 1 / 16, "flops": 1e9, "compile_s": 1.0}
        return {"train": {**report, "hbm_gib": 16, "target": "tpu:v5e:1x1"}}

    monkeypatch.setattr(aot, "compile_programs", compile_programs)
    module = SimpleNamespace(SWEEP_KEY="h", SWEEP_VALUES=(1, 2, 4), get_config=lambda point: point)
    rows = plan.plan(module, aot.parse_target("tpu:v5e"), devices=[])
    assert [(r["point"], r["points_per_device"]) for r in rows] == [("h=1", 15), ("h=2", 0), ("h=4", 15)]
    assert [s.split("|")[-1].split(", ")[-1] for s in seen] == [
        "h=1; 0 refused so far]",
        "h=2; 0 refused so far]",
        "h=4; 1 refused so far]",
    ]
    assert [s.split("|")[2].split()[0] for s in seen] == ["0/3", "1/3", "2/3"]
    assert terminal.getvalue().split("\r")[-1].startswith("[plan] compiling: 100%")


# --- sweep.py plan --stack_seeds S -------------------------------------------------------------------------------

needs_libtpu = pytest.mark.skipif(
    not aot.has_libtpu(), reason="the libtpu wheel is absent: pip install -c requirements.lock -e '.[aot]'"
)


def packed_tiny(values=(2,)):
    """tiny_sweep's points, packed (stacked seeds need one batch shape), 8 rows x 64 tokens a seed."""
    tiny = schema.load_module(TINY)

    def get_config(point):
        config = tiny.get_config(point)
        config.data.pack_length = 64
        return config

    return SimpleNamespace(SWEEP_KEY="h", SWEEP_VALUES=values, get_config=get_config)


@pytest.mark.slow
@needs_libtpu
def test_a_stacked_plan_lays_eight_seeds_over_a_v5e_8_and_books_its_roofline():
    target = aot.parse_target("tpu:v5e:2x4")
    (row,) = plan.plan_stacked(packed_tiny(), target, stack=8, seeds=8)
    assert (row["point"], row["seeds"], row["stacks"], row["steps"]) == ("h=2", 8, 1, 4)
    assert row["refused"] is None and row["mesh"] == {"seed": 8, "data": 1}
    assert 0 < row["needs_bytes"] < 16 * aot.GIB and row["roofline_s"] > 0 and row["compile_s"] > 0
    assert all(n == 0 for n, _ in row["collectives"].values())  # one seed a chip: nothing to exchange
    hours = plan.booking_hours([row], target)
    assert hours == pytest.approx(4 * 1 * row["roofline_s"] * 8 / 3600)
    text = plan.stacked_table([row], target, 8, 8)
    assert "| h=2 | 8 | 1 | 4 | seed 8 x data 1 |" in text and "| none |" in text
    assert f"at least {hours:,.6f} device-hours of tpu:v5e:2x4 = the sum over 1 point(s) and their " in text
    assert "LOWER BOUND from the compiler's roofline" in text and "not a measurement" in text


@pytest.mark.slow
@needs_libtpu
def test_three_seeds_on_eight_chips_split_each_seeds_batch_and_exchange_nothing_across_seeds():
    # what `run --seeds 3 --stack_seeds 8` trains on a v5e-8: one stack of three, each seed's 8 rows over 8 chips
    target = aot.parse_target("tpu:v5e:2x4")
    (row,) = plan.plan_stacked(packed_tiny(), target, stack=8, seeds=3, steps=100)
    assert (row["seeds"], row["stacks"], row["steps"], row["mesh"]) == (3, 1, 100, {"seed": 1, "data": 8})
    assert row["collectives"]["all-reduce"][0] > 0  # the gradients' sum over the data shards...
    assert all(across == 0 for _, across in row["collectives"].values())  # ...within a seed shard
    assert "all-reduce" in plan.stacked_table([row], target, 8, 3) and "none across seeds" in plan.stacked_table(
        [row], target, 8, 3
    )


def fake_report(stack, needed=aot.GIB, roofline=0.01, hlo="ENTRY %main () -> f32[] {\n}\n"):
    """`aot.compile_programs`' train report for a v5e-8 whose roofline is `roofline` seconds (its bytes' term)."""
    return {
        "target": "tpu:v5e:2x4",
        "mesh": dict(zip(("seed", "data"), stacked_layout(stack))),
        "memory_bytes": {"needed": needed},
        "hbm_gib": 16,
        "hbm_share": needed / (16 * aot.GIB),
        "flops": 197e12 * roofline / 2,
        "bytes_accessed": 819e9 * roofline,
        "compile_s": 1.0,
        "hlo": hlo,
    }


def stacked_layout(stack):
    from training.parallel import stacked

    return stacked.layout(stack, 8)


def test_a_last_smaller_stack_is_compiled_and_booked_on_its_own(monkeypatch):
    compiled = []

    def compile_programs(config, target, programs, devices, keep_hlo, stack):
        compiled.append((config.model.num_heads, stack))
        return {"train": fake_report(stack, roofline=0.01 * stack)}

    monkeypatch.setattr(aot, "compile_programs", compile_programs)
    target = aot.parse_target("tpu:v5e:2x4")
    rows = plan.plan_stacked(packed_tiny((1, 2)), target, stack=4, seeds=5, devices=[None] * 8)
    assert compiled == [(1, 4), (1, 1), (2, 4), (2, 1)]  # --seeds 5 --stack_seeds 4: stacks of 4 and of 1
    assert [(r["point"], r["seeds"], r["stacks"]) for r in rows] == [
        ("h=1", 4, 1),
        ("h=1", 1, 1),
        ("h=2", 4, 1),
        ("h=2", 1, 1),
    ]
    assert [r["mesh"] for r in rows[:2]] == [{"seed": 4, "data": 2}, {"seed": 1, "data": 8}]
    assert plan.booking_hours(rows, target) == pytest.approx(4 * (0.04 + 0.01) * 2 * 8 / 3600)
    assert (
        plan.stack_sizes(3, 8) == {3: 1} and plan.stack_sizes(8, 8) == {8: 1} and plan.stack_sizes(9, 4) == {4: 2, 1: 1}
    )
    with pytest.raises(ValueError, match="--stack_seeds must be a positive int, got 0"):
        plan.stack_sizes(3, 0)


def test_stacks_that_do_not_fit_or_train_on_buckets_are_refused_and_idle_chips_said_in_one_line(monkeypatch):
    def compile_programs(config, target, programs, devices, keep_hlo, stack):
        if config.model.num_heads == 2:
            raise aot.DoesNotFit("the train step needs 20.0 GiB a device (HLO temporaries alone); a v5e has 16")
        return {"train": fake_report(stack, needed=18 * aot.GIB)}

    monkeypatch.setattr(aot, "compile_programs", compile_programs)
    target = aot.parse_target("tpu:v5e:2x4")
    module = packed_tiny((1, 2, 4, 8))
    get_config = module.get_config

    def get_config_with_cases(point):
        config = get_config(point)
        if point == "h=4":  # 2 rows a seed, split over the 8 chips one seed spans: 6 chips hold padding alone
            config.data.token_budget = 128
        if point == "h=8":
            config.data.pack_length = 0
        return config

    module.get_config = get_config_with_cases
    rows = plan.plan_stacked(module, target, stack=1, seeds=1, devices=[None] * 8)
    why = {r["point"]: r["refused"] for r in rows}
    assert why["h=1"] == "the train step needs 18.0 GiB a device; a v5e has 16"
    assert why["h=2"].startswith("the train step needs 20.0 GiB a device")
    # a stack that leaves devices idle is said in one line, and planned (it runs: training.run.stacked_run)
    assert why["h=4"] == "the train step needs 18.0 GiB a device; a v5e has 16"
    idle = {r["point"]: r.get("idle") for r in rows}
    assert idle["h=4"] == (
        "1 stacked seed(s) on 8 devices split each seed's 2 rows over 8 devices: 6 of the 8 hold only padding rows "
        "(they run, computing nothing of use; stack more seeds a device)"
    )
    assert why["h=8"].startswith("trains on length buckets (config.data.pack_length = 0)")
    text = plan.stacked_table(rows, target, 1, 1)
    assert all(line.count("refused: ") == 1 for line in text.splitlines() if line.startswith("| h="))
    assert f"h=4: {idle['h=4']}" in text.splitlines()
    assert text.endswith("Booking: no bound; 4 of 4 stack(s) refused")
    assert (
        stacked.idle_devices(rows=8, seed_shards=1, data=8) == 0
        and stacked.idle_devices(rows=5, seed_shards=2, data=4) == 2
    )


def test_collectives_are_read_for_groups_that_cross_seeds():
    # device i of a (seed 4, data 2) mesh holds seed shard i // 2
    groups = {
        "replica_groups=[4,2]<=[8]": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "replica_groups=[2,4]<=[4,2]T(1,0)": [[0, 2, 4, 6], [1, 3, 5, 7]],
        "replica_groups=mesh['seed'=4,'data'=2] {'data'}": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}": [[0, 2, 4, 6], [1, 3, 5, 7]],
        "replica_groups={{0,1},{2,3}}": [[0, 1], [2, 3]],
        "replica_groups={}": [list(range(8))],
        "source_target_pairs={{0,2},{2,4}}": [[0, 2], [2, 4]],
    }
    for attributes, expected in groups.items():
        assert plan.replica_groups(f", channel_id=1, {attributes}, use_global_device_ids=true", 8) == expected
    assert plan.replica_groups(", replica_groups=something_new", 8) is None
    hlo = "\n".join(
        [
            "ENTRY %main (p: f32[2]) -> f32[2] {",
            "  %p = f32[2]{0} parameter(0)",
            "  %a = f32[2]{0} all-reduce(%p), channel_id=1, replica_groups=[4,2]<=[8], to_apply=%add",
            "  %b = f32[2]{0} all-reduce(%a), channel_id=2, replica_groups=[2,4]<=[4,2]T(1,0), to_apply=%add",
            "  ROOT %c = f32[2]{0} collective-permute(%b), channel_id=3, source_target_pairs={{0,1}}",
            "}",
        ]
    )
    found = plan.seed_collectives(hlo, {"seed": 4, "data": 2})
    assert found["all-reduce"] == (2, 1) and found["collective-permute"] == (1, 0) and found["all-gather"] == (0, 0)
    assert plan._collectives_cell(found) == "all-reduce 2, collective-permute 1, 1 across seeds"


def test_sweep_py_plan_takes_seeds_and_steps_with_stack_seeds_only():
    sys.path.insert(0, str(Path(__file__).parents[2]))
    import sweep

    args = sweep.parse_arguments(["sweep.py", "plan", "--config", str(TINY), "--target", "tpu:v5e", "--steps", "9"])
    with pytest.raises(ValueError, match="--steps apply with --stack_seeds only"):
        sweep.plan_sweep(args)
    args = sweep.parse_arguments(
        ["sweep.py", "plan", "--config", str(TINY), "--target", "tpu:v5e:2x4", "--stack_seeds", "8", "--mesh", "2,4"]
    )
    with pytest.raises(ValueError, match="--mesh 2,4 with --stack_seeds"):
        sweep.plan_sweep(args)
