"""The paired bootstrap helper against sacreBLEU's own command line (`sacrebleu --paired-bs`) on a small fixture."""

import json
import random
import subprocess
import sys

import pytest

from sweeps import significance, store

WORDS = "a man in a red shirt is riding a bike down the street while two dogs watch from the grass".split()


def fixture(n=60, seed=0):
    """References and two systems: the baseline drops one word in a few sentences, the other in most."""
    rng = random.Random(seed)
    references = [" ".join(rng.sample(WORDS, 10)) for _ in range(n)]

    def corrupt(rate):
        out = []
        for sentence in references:
            words = sentence.split()
            if rng.random() < rate:
                del words[rng.randrange(len(words))]
            out.append(" ".join(words))
        return out

    return references, corrupt(0.2), corrupt(0.6), corrupt(0.2)


def sacrebleu_cli_p_value(tmp_path, references, baseline, system):
    for name, lines in (("ref", references), ("base", baseline), ("sys", system)):
        (tmp_path / f"{name}.txt").write_text("".join(line + "\n" for line in lines))
    done = subprocess.run([sys.executable, "-m", "sacrebleu", "ref.txt", "-i", "base.txt", "sys.txt", "--paired-bs",
                           "--paired-bs-n", "1000", "-m", "bleu", "-f", "json"], cwd=tmp_path, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)[1]["BLEU"]["p_value"]


def test_paired_bootstrap_matches_sacrebleu_cli(tmp_path):
    references, baseline, system, similar = fixture()
    expected = sacrebleu_cli_p_value(tmp_path, references, baseline, system)
    assert significance.paired_bootstrap(baseline, system, references) == pytest.approx(expected, abs=1e-12)
    assert expected < 0.05  # the fixture's difference is a real one ...
    chance = sacrebleu_cli_p_value(tmp_path, references, baseline, similar)
    assert significance.paired_bootstrap(baseline, similar, references) == pytest.approx(chance, abs=1e-12)
    assert chance > 0.05  # ... and one of chance only


def test_seed_pairs_compare_seed_k_with_reference_seed_k(tmp_path):
    references, baseline, system, _ = fixture()
    spec = {"key": "h", "reference": 8, "test_split": "test"}
    store.references_path(tmp_path, "test").write_text("".join(r + "\n" for r in references))
    hyps = {(8, 0): baseline, (8, 1): system, (4, 0): system, (4, 1): system, (4, 2): baseline}  # h4 seed 2 has no pair
    for (value, seed), lines in hyps.items():
        path = store.point_path(tmp_path, "h", value, seed) / store.hypotheses_name("test")
        path.parent.mkdir(parents=True)
        path.write_text("".join(line + "\n" for line in lines))
    results = [{"value": v, "seed": s} for v, s in hyps]
    p = significance.seed_pair_p_values(tmp_path, spec, results)
    assert list(p) == [4] and len(p[4]) == 2
    assert p[4][0] == pytest.approx(sacrebleu_cli_p_value(tmp_path, references, baseline, system))
    assert p[4][1] == pytest.approx(sacrebleu_cli_p_value(tmp_path, references, system, system))


def test_mismatched_lengths_are_named():
    with pytest.raises(ValueError, match="same sentences"):
        significance.paired_bootstrap(["a b"], ["a b", "c"], ["a b"])
