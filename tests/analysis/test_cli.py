"""analyze.py end to end on a tiny model trained for a few steps on a Multi30k slice."""

import csv
import json
import os
import re

import pytest
import sacrebleu

import analyze
import tiny
from analysis import workdir as analysis_workdir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    config = tiny.train_config(20, **{"model.num_heads": 4})  # heads to group: G=2 is a real GQA
    workdir = tmp_path_factory.mktemp("tiny")
    from training.run import loop

    loop.train_and_evaluate(config, workdir)
    return workdir


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_maps_roles_importance(workdir, capsys):
    analyze.main(["maps", "--workdir", str(workdir), "--sentence", "Ein Hund läuft."])
    analyze.main(["maps", "--workdir", str(workdir), "--index", "2"])
    out = workdir / "analysis"
    for kind in ("encoder_self", "decoder_self", "decoder_cross"):
        assert (out / f"maps_sentence_{kind}.png").stat().st_size > 1000
        assert (out / f"maps_val2_{kind}.png").exists()
    analyze.main(["roles", "--workdir", str(workdir), "--examples", "16"])
    table = rows(out / "roles.csv")
    assert len(table) == 3 * 1 * 4 and (out / "roles.png").exists() and (out / "roles.md").exists()
    assert {r["label"] for r in table} <= {"previous", "same", "next", "anchor", "diagonal", "broad", "mixed"}
    analyze.main(["importance", "--workdir", str(workdir), "--examples", "16"])
    scores = rows(out / "importance.csv")
    assert len(scores) == 12 and all(float(r["raw"]) >= 0 for r in scores)
    for kind in ("encoder_self", "decoder_self", "decoder_cross"):  # each layer normalised to unit L2 norm
        assert sum(float(r["normalised"]) ** 2 for r in scores if r["kind"] == kind) == pytest.approx(1.0, abs=1e-3)


def test_prune(workdir):
    analyze.main(
        [
            "prune",
            "--workdir",
            str(workdir),
            "--examples",
            "8",
            "--eval_examples",
            "8",
            "--steps",
            "2",
            "--kinds",
            "encoder_self,decoder_cross",
            "--test_split",
            "test_2016_flickr",
            "--test_examples",
            "6",
        ]
    )
    table = rows(workdir / "analysis" / "pruning_encoder_self-decoder_cross.csv")  # named by --kinds
    assert [(r["order"], r["pruned"]) for r in table] == [
        (o, str(n)) for o in ("importance", "random", "reverse") for n in (0, 4, 8)
    ]
    first = [r for r in table if r["pruned"] == "0"]
    assert len({(r["bleu"], r["loss"]) for r in first}) == 1  # nothing pruned: the same model for every order
    everything = [r for r in table if r["pruned"] == "8"]  # all pruned: the same set, in three orders
    assert len({frozenset(r["heads"].split()) for r in everything}) == 1 and len({r["bleu"] for r in everything}) == 1
    assert (workdir / "analysis" / "pruning_encoder_self-decoder_cross.png").exists()
    held_out = rows(workdir / "analysis" / "pruning_encoder_self-decoder_cross_test_2016_flickr_50pct.csv")
    assert [(r["model"], r["pruned"], r["of"]) for r in held_out] == [
        ("unpruned", "0", "0"),
        ("importance order", "4", "8"),
        ("random order", "4", "8"),
    ]
    for r in held_out[1:]:
        assert float(r["delta"]) == pytest.approx(float(r["bleu"]) - float(held_out[0]["bleu"]), abs=1e-3)
        assert 0 <= float(r["p_bootstrap"]) <= 1 and 0 <= float(r["p_randomization"]) <= 1
    # The committed outputs re-derive the comparison: sacreBLEU on the written hypotheses gives the table's BLEU,
    # and the importance-order heads are the curve's first 4 in importance order.
    stem = workdir / "analysis" / "pruning_encoder_self-decoder_cross_test_2016_flickr_50pct"
    references = list(analysis_workdir.dev_subset(analysis_workdir.load(workdir).config, "test_2016_flickr", 6).tgt)
    pruned_heads = json.loads(stem.with_name(stem.name + ".heads.json").read_text())
    assert pruned_heads["unpruned"] == [] and len(pruned_heads["random order"]) == 4
    curve_heads = next(r["heads"] for r in table if r["order"] == "importance" and r["pruned"] == "4")
    assert sorted(pruned_heads["importance order"]) == sorted(curve_heads.split())
    for r in held_out:
        lines = (
            stem.with_name(f"{stem.name}.{r['model'].replace(' ', '_')}.txt").read_text(encoding="utf-8").splitlines()
        )
        assert len(lines) == 6
        assert sacrebleu.corpus_bleu(lines, [references]).score == pytest.approx(float(r["bleu"]), abs=0.01)


def test_uptrain(workdir):
    args = [
        "uptrain",
        "--workdir",
        str(workdir),
        "--num_kv_heads",
        "2",
        "--fraction",
        "0.1",
        "--methods",
        "mean",
        "--examples",
        "8",
        "--speed_rows",
        "4",
    ]
    analyze.main(args)
    table = rows(workdir / "analysis" / "uptrain_table_kv2_mean.csv")
    assert [(r["kv_heads"], r["steps"]) for r in table] == [("4", "0"), ("2", "0"), ("2", "2")]
    assert float(table[0]["speed_vs_mha"]) == 1.0
    up = workdir / "analysis" / "uptrain_kv2_mean"
    assert sorted(p.name for p in (up / "checkpoints").iterdir() if p.name.isdigit()) == ["20", "22"]
    with pytest.raises(FileExistsError):
        analyze.main(args)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["prune", "--steps", "0"], "--steps 0; expected an int >= 1"),  # was a ZeroDivisionError
        (["roles", "--examples", "-1"], "--examples -1; expected an int >= 0"),
        (["maps", "--sentence", ""], "--sentence is empty"),  # was translated as --index 0 of --split
        (["maps", "--index", "-2"], "--index -2; expected an int >= 0"),
        (["uptrain", "--num_kv_heads", "2", "--fraction", "0"], "--fraction 0.0; expected a number > 0"),
    ],
)
def test_a_bad_flag_is_named_before_the_workdir_is_read(tmp_path, argv, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        analyze.main([*argv, "--workdir", str(tmp_path / "nowhere")])


@pytest.mark.parametrize(
    "argv, named",
    [
        (["maps", "--index", "99999"], "--index 99999; expected an index below 1014, the pairs in --split 'val'"),
        (["roles", "--split", "vall"], "--split = 'vall'; expected one of Multi30k's splits"),
    ],
)
def test_a_flag_the_workdir_cannot_serve_is_named(workdir, argv, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        analyze.main([*argv, "--workdir", str(workdir)])
