"""The batches are bit-identical to those every committed result trained on.

batch_hashes.json holds, for the default config (packed rows) and the Table 3 preset (length buckets, and its
packed variant), the SHA-256 of the first 2,000 batches (after 500, 1,000, 1,500 and 2,000 of them) as the
schedule written before the prepared-data path produced them (token lists, one epoch plan drawn per step, rows
assembled in Python), with the vocabulary trained as train.py trains it on Multi30k's training split.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from training import prepared
from training.data import tokenizer
from training.data.batching import BatchSchedule, as_arrays
from training.data.corpus import load_corpus

HASHES = json.loads(Path(__file__).with_name("batch_hashes.json").read_text())
CONFIGS = {
    "default": ("configs/default.py", None),
    "table3_preset": ("configs/ablation_heads.py", "h=8"),
    "table3_preset_packed": ("configs/ablation_heads.py", "h=8,packed"),
}
ROOT = Path(__file__).resolve().parents[3]


def hashes(schedule: BatchSchedule, steps: int = 2000, every: int = 500) -> dict[str, str]:
    digest, found = hashlib.sha256(), {}
    for step in range(steps):
        arrays = as_arrays(schedule.batch(step))
        for name in sorted(arrays):
            a = np.ascontiguousarray(arrays[name])
            digest.update(name.encode() + str(a.shape).encode() + str(a.dtype).encode() + a.tobytes())
        if (step + 1) % every == 0:
            found[str(step + 1)] = digest.hexdigest()
    return found


@functools.cache
def config(name: str):
    path, arg = CONFIGS[name]
    spec = importlib.util.spec_from_file_location(f"config_{name}", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


@pytest.fixture(scope="module")
def multi30k(tmp_path_factory):
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    return tmp_path_factory.mktemp("prepared")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_first_2000_batches_are_todays(name, multi30k):
    cfg = config(name)
    data = prepared.prepare(cfg, cache=multi30k)
    assert hashlib.sha256(data.vocab_proto).hexdigest() == HASHES[name]["vocab_sha256"]
    schedule = prepared.schedule(cfg, data)
    assert schedule.batches_per_epoch == HASHES[name]["batches_per_epoch"]
    assert hashes(schedule) == HASHES[name]["sha256_after"]


def test_token_lists_give_the_same_batches_as_prepared_arrays(multi30k):
    """The list path (BatchSchedule over `encode`'s lists, as tests and benchmarks build it) is the same function."""
    cfg = config("default")
    train = load_corpus(cfg, cfg.data.train_split)
    vocab = tokenizer.load(prepared.prepare(cfg, cache=multi30k).vocab_proto)
    schedule = BatchSchedule(
        vocab.encode(list(train.src)),
        vocab.encode(list(train.tgt)),
        token_budget=cfg.data.token_budget,
        bucket_lengths=cfg.data.bucket_lengths,
        seed=cfg.seed,
        pack_length=cfg.data.pack_length,
    )
    assert hashes(schedule, steps=500) == {"500": HASHES["default"]["sha256_after"]["500"]}
