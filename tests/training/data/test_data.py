"""Corpus loading, the SentencePiece vocabulary and token-budget batching."""

import gzip
import io
import os
import urllib.error
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from training.data import corpus as data, tokenizer
from training.data import batching
from training.data.batching import PACKING_FIELDS, BatchSchedule, as_arrays


@pytest.fixture(scope="module")
def multi30k_dir():
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    return Path(os.environ["MULTI30K_DIR"])


def write_gz(path, lines):
    path.write_bytes(gzip.compress("\n".join(lines).encode("utf-8") + b"\n"))


def test_multi30k_splits_have_the_published_sizes(multi30k_dir):
    sizes = {
        split: len(data.load_multi30k(multi30k_dir, split, "de", "en", download=False))
        for split in data.MULTI30K_SPLITS
    }
    assert sizes == {"train": 29000, "val": 1014, "test_2016_flickr": 1000}
    val = data.load_multi30k(multi30k_dir, "val", "fr", "cs", download=False)
    assert val.dropped == {"empty": 0} and len(val.src) == len(val.tgt) == 1014


def test_empty_lines_are_dropped_and_counted(tmp_path):
    write_gz(tmp_path / "train.de.gz", ["Ein Hund.", "", "Eine Katze.", "Ein Haus."])
    write_gz(tmp_path / "train.en.gz", ["A dog.", "Nothing.", "A cat.", "  "])
    corpus = data.load_multi30k(tmp_path, "train", "de", "en", download=False)
    assert corpus.src == ("Ein Hund.", "Eine Katze.") and corpus.tgt == ("A dog.", "A cat.")
    assert corpus.dropped == {"empty": 2}


def test_misaligned_and_non_utf8_files_raise(tmp_path):
    write_gz(tmp_path / "val.de.gz", ["a", "b", "c"])
    write_gz(tmp_path / "val.en.gz", ["a", "b"])
    with pytest.raises(ValueError, match="val.de.gz has 3 lines, .*val.en.gz has 2"):
        data.load_multi30k(tmp_path, "val", "de", "en", download=False)
    (tmp_path / "val.en.gz").write_bytes(gzip.compress(b"fine\n\xff\xfe broken\n"))
    with pytest.raises(ValueError, match=r"val.en.gz is not UTF-8 \(line 2"):
        data.load_multi30k(tmp_path, "val", "de", "en", download=False)


def test_missing_files_name_the_directory_and_the_fix(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/train.de.gz is missing.*MULTI30K_DIR"):
        data.load_multi30k(tmp_path, "train", "de", "en", download=False)

    def offline(url, timeout):
        raise urllib.error.URLError("network unreachable")

    monkeypatch.setattr(data.urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match="Downloading https://.*train.de.gz failed"):
        data.load_multi30k(tmp_path, "train", "de", "en")
    assert not list(tmp_path.iterdir())  # no partial file left behind


def test_missing_files_are_downloaded(tmp_path, monkeypatch):
    payload = {name: gzip.compress(f"{name} line\n".encode()) for name in ("val.de.gz", "val.en.gz")}
    requested = []

    def fake_urlopen(url, timeout):
        requested.append(url)
        return io.BytesIO(payload[url.rsplit("/", 1)[1]])

    monkeypatch.setattr(data.urllib.request, "urlopen", fake_urlopen)
    corpus = data.load_multi30k(tmp_path / "cache", "val", "de", "en")
    assert corpus.src == ("val.de.gz line",) and len(requested) == 2
    assert all(url.startswith("https://") and "task1/raw" in url for url in requested)


@pytest.mark.parametrize(
    "args, message",
    [(("dev", "de", "en"), "data split"), (("val", "xx", "en"), "data.src"), (("val", "de", "de"), "must differ")],
)
def test_bad_corpus_arguments_raise(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        data.load_multi30k(tmp_path, *args, download=False)


def test_default_directory_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MULTI30K_DIR", str(tmp_path))
    assert data.default_multi30k_dir() == tmp_path
    monkeypatch.delenv("MULTI30K_DIR")
    assert data.default_multi30k_dir() == Path.home() / ".cache" / "headcount" / "multi30k"


def test_tfds_translation_datasets_load_through_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=7):
        corpus = data.load_tfds("wmt14_translate/de-en", "validation", "en", "de")
    assert len(corpus) + corpus.dropped["empty"] == 7
    assert all(isinstance(s, str) and s for s in corpus.src + corpus.tgt)


def test_vocabulary_is_trained_once_and_reused(tmp_path):
    texts = [f"the dog number {i} runs to the house" for i in range(200)] + ["ein Hund läuft"] * 50
    path = tmp_path / "spm.model"
    sp = tokenizer.load_or_train(path, texts, vocab_size=40)
    assert (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id()) == (0, 1, 2, 3)
    assert sp.decode(sp.encode("the dog runs")) == "the dog runs"
    stamp = path.stat().st_mtime_ns
    again = tokenizer.load_or_train(path, ["completely different text"], vocab_size=40)
    assert path.stat().st_mtime_ns == stamp
    assert again.encode("ein Hund läuft") == sp.encode("ein Hund läuft")


def schedule(seed=0, n=200, budget=64):
    rng = np.random.default_rng(123)
    src = [list(rng.integers(4, 50, rng.integers(1, 14))) for _ in range(n)]
    tgt = [list(rng.integers(4, 50, rng.integers(1, 14))) for _ in range(n)]
    src[7] = list(range(4, 40))  # too long for every bucket
    return src, tgt, BatchSchedule(src, tgt, token_budget=budget, bucket_lengths=(8, 16), seed=seed)


def test_each_epoch_serves_every_fitting_example_once_in_fixed_shapes():
    src, tgt, sched = schedule()
    assert sched.examples_dropped == 1
    seen = []
    for step in range(sched.batches_per_epoch):
        batch = sched.batch(step)
        assert batch.src.shape in {(8, 8), (4, 16)} and batch.src.shape == batch.tgt_in.shape
        for row in range(batch.src.shape[0]):
            length = int(np.count_nonzero(batch.src[row]))
            if length:
                seen.append(tuple(batch.src[row, :length]))
    assert sorted(seen) == sorted(tuple(s) for i, s in enumerate(src) if i != 7)


def test_batches_are_deterministic_per_seed_and_differ_across_epochs_and_seeds():
    _, _, a = schedule(seed=0)
    _, _, b = schedule(seed=0)
    _, _, c = schedule(seed=1)
    n = a.batches_per_epoch
    for step in (0, 3, n + 2):  # a fresh schedule (as after a restart) serves the same batch
        np.testing.assert_array_equal(a.batch(step).src, b.batch(step).src)
    assert any(not np.array_equal(a.batch(s).src, c.batch(s).src) for s in range(5))
    assert any(not np.array_equal(a.batch(s).src, a.batch(s + n).src) for s in range(5))


def test_assembled_batch_by_hand():
    batch = BatchSchedule.assemble([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], rows=3, length=4)
    np.testing.assert_array_equal(batch.src, [[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.tgt_in, [[2, 9, 10, 0], [2, 11, 12, 13], [0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.tgt_out, [[9, 10, 1, 0], [11, 12, 13, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(batch.weights, [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert batch.padding_fraction == pytest.approx(1 - (4 + 7) / 24)


def test_bad_batching_arguments_raise():
    with pytest.raises(ValueError, match="token_budget"):
        BatchSchedule([[4]], [[4]], token_budget=8, bucket_lengths=(16,), seed=0)
    with pytest.raises(ValueError, match="no example fits"):
        BatchSchedule([[4] * 20], [[4]], token_budget=64, bucket_lengths=(8,), seed=0)


def test_packed_batch_by_hand():
    rows = [[([5, 6], [9]), ([7], [10, 11])], [([8, 8, 8], [12])]]
    batch = BatchSchedule.assemble_packed(rows, rows=3, length=5)
    np.testing.assert_array_equal(batch.src, [[5, 6, 7, 0, 0], [8, 8, 8, 0, 0], [0] * 5])
    np.testing.assert_array_equal(batch.src_segments, [[1, 1, 2, 0, 0], [1, 1, 1, 0, 0], [0] * 5])
    np.testing.assert_array_equal(batch.src_positions, [[0, 1, 0, 0, 0], [0, 1, 2, 0, 0], [0] * 5])
    np.testing.assert_array_equal(batch.tgt_in, [[2, 9, 2, 10, 11], [2, 12, 0, 0, 0], [0] * 5])
    np.testing.assert_array_equal(batch.tgt_out, [[9, 1, 10, 11, 1], [12, 1, 0, 0, 0], [0] * 5])
    np.testing.assert_array_equal(batch.tgt_segments, [[1, 1, 2, 2, 2], [1, 1, 0, 0, 0], [0] * 5])
    np.testing.assert_array_equal(batch.tgt_positions, [[0, 1, 0, 1, 2], [0, 1, 0, 0, 0], [0] * 5])
    np.testing.assert_array_equal(batch.weights, [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0] * 5])
    assert sorted(as_arrays(batch)) == sorted(["src", "tgt_in", "tgt_out", "weights", *PACKING_FIELDS])
    assert sorted(as_arrays(BatchSchedule.assemble([[5]], [[6]], 1, 2))) == ["src", "tgt_in", "tgt_out", "weights"]


def test_pack_rows_first_fit_among_the_open_rows(monkeypatch):
    # (source, target + 1) slots of examples 0..5 in rows of 6, worked by hand with 2 open rows:
    # 0 opens row 0 (free 2, 4); 1 fits no row: row 1 (free 3, 2); 2 fits row 0 (free 0, 2);
    # 3 fits none: row 2 (free 4, 1), and row 0 closes (open: 1, 2); 4 fits none: row 3 (free 1, 5),
    # row 1 closes (open: 2, 3); 5 would fit row 1, but that is closed, and fits neither 2 nor 3: row 4
    src_len, tgt_len = np.array([4, 3, 2, 2, 5, 3]), np.array([2, 4, 2, 5, 1, 2])
    monkeypatch.setattr(batching, "OPEN_ROWS", 2)
    assert batching.pack_rows([0, 1, 2, 3, 4, 5], src_len, tgt_len, 6) == [[0, 2], [1], [3], [4], [5]]
    assert batching.pack_rows([0, 1, 2], src_len, tgt_len, 6) == [[0, 2], [1]]
    monkeypatch.setattr(batching, "OPEN_ROWS", 16)
    assert batching.pack_rows([0, 1, 2, 3, 4, 5], src_len, tgt_len, 6) == [[0, 2], [1, 5], [3], [4]]


def test_a_packed_epoch_serves_every_fitting_pair_once_in_one_shape():
    src, tgt, _ = schedule()
    sched = BatchSchedule(src, tgt, token_budget=64, bucket_lengths=(8, 16), seed=0, pack_length=16)
    assert sched.examples_dropped == 1  # src[7] has 36 tokens
    seen = []
    for step in range(sched.batches_per_epoch):
        batch = sched.batch(step)
        assert batch.src.shape == batch.tgt_out.shape == (4, 16)
        for row in range(4):
            for k in range(1, batch.src_segments[row].max() + 1):
                seen.append(
                    (
                        tuple(batch.src[row, batch.src_segments[row] == k]),
                        tuple(batch.tgt_out[row, batch.tgt_segments[row] == k]),
                    )
                )
    assert sorted(seen) == sorted((tuple(s), (*t, 1)) for i, (s, t) in enumerate(zip(src, tgt)) if i != 7)
    again = BatchSchedule(src, tgt, token_budget=64, bucket_lengths=(8, 16), seed=0, pack_length=16)
    np.testing.assert_array_equal(again.batch(3).src_segments, sched.batch(3).src_segments)


@pytest.mark.parametrize(
    "pack_length, message", [(1, "pack_length must be 0"), (128, "one row of the longest packed row")]
)
def test_bad_pack_length_raises(pack_length, message):
    with pytest.raises(ValueError, match=message):
        BatchSchedule([[4]], [[4]], token_budget=64, bucket_lengths=(8,), seed=0, pack_length=pack_length)


def test_dev_batches_keep_every_pair_an_over_long_one_in_a_batch_of_its_own_length():
    # The end-to-end tiny configs cut every dev pair to their largest bucket; this is the path they no longer take.
    class Words:  # a vocabulary whose sentences are already token ids, written out
        encode = staticmethod(lambda texts: [[int(w) for w in text.split()] for text in texts])

    src = [[5, 6, 7], list(range(10, 16)), list(range(20, 30)), list(range(40, 55))]
    tgt = [[8, 9], list(range(10, 15)), [31, 32, 33], list(range(60, 80))]
    text = lambda sentences: [" ".join(map(str, s)) for s in sentences]
    config = SimpleNamespace(
        model=SimpleNamespace(max_len=12), data=SimpleNamespace(bucket_lengths=(4, 8), token_budget=16)
    )
    batches = batching.dev_batches(config, Words, SimpleNamespace(src=text(src), tgt=text(tgt)))
    # lengths max(src, tgt + 1): 3 -> bucket 4 (16 // 4 rows), 6 -> 8 (2 rows); 10 and the cut 12 stay as they are
    assert [b["src"].shape for b in batches] == [(4, 4), (2, 8), (1, 10), (1, 12)]
    np.testing.assert_array_equal(batches[2]["src"][0], list(range(20, 30)))
    np.testing.assert_array_equal(batches[3]["src"][0], list(range(40, 52)))  # cut to max_len
    np.testing.assert_array_equal(batches[3]["tgt_out"][0], [*range(60, 71), batching.EOS_ID])  # max_len - 1 + EOS
    assert [int(b["weights"].sum()) for b in batches] == [3, 6, 4, 12]
