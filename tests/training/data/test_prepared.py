"""The prepared training data (training.prepared): its arrays are the vocabulary's encoding of the corpus, a
damaged or foreign directory is refused in one line and never re-tokenized, a killed prepare leaves nothing a
run reads, a tfds corpus is streamed, and processes that gather their own rows of a batch gather the batch.

Most tests run on a small synthetic corpus in Multi30k's layout (empty and padded lines included), so they need
no download; the encoding check runs on Multi30k's first pairs as well where MULTI30K_DIR is set.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import inspect
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from models.tokens import PAD_ID
from training import prepared
from training.data import corpus, tokenizer
from training.data.batching import PACKING_FIELDS, BatchSchedule, as_arrays

ROOT = Path(__file__).resolve().parents[3]
LIMIT, VOCAB = 300, 200  # pairs prepared, vocabulary size
LINES = 420  # lines of the synthetic corpus: the limit cuts it
ARRAYS = ("src.tokens.i32", "src.offsets.i64", "tgt.tokens.i32", "tgt.offsets.i64")
WORDS = {
    "de": "ein eine der die das Hund Katze Mann Frau Kind läuft spielt sitzt über unter große kleine Straße Wasser "
    "Ball grün rot weiß schön Fahrrad fährt schnell Mädchen Jungen".split(),
    "en": "a an the dog cat man woman child runs plays sits over under big small street water ball green red "
    "white nice bicycle rides fast girl boys".split(),
}


def config_of(**data):
    """configs/default.py with a tiny vocabulary and `LIMIT` training pairs; `data` overrides config.data."""
    spec = importlib.util.spec_from_file_location("config_default", ROOT / "configs" / "default.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.data.train_limit, config.data.vocab_size = LIMIT, VOCAB
    for key, value in data.items():
        setattr(config.data, key, value)
    return config


def synthetic_lines(language: str, seed: int) -> list[str]:
    """`LINES` seeded sentences; every 37th German and every 53rd English line empty or blank, some padded."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(LINES):
        line = " ".join(rng.choice(WORDS[language], size=int(rng.integers(2, 14)))).capitalize() + "."
        if i % 11 == 5:
            line = f"  {line}\t "
        if (language == "de" and i % 37 == 7) or (language == "en" and i % 53 == 9):
            line = "" if language == "de" else "   "
        lines.append(line)
    return lines


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A directory with train.{de,en}.gz in Multi30k's layout, and its config."""
    directory = tmp_path_factory.mktemp("synthetic")
    for seed, language in enumerate(("de", "en")):
        text = "\n".join(synthetic_lines(language, seed)) + "\n"
        (directory / f"train.{language}.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    return config_of(dir=str(directory))


@pytest.fixture(scope="module")
def base(synthetic, tmp_path_factory):
    """The synthetic corpus prepared once into a cache of its own (tests copy it before damaging it)."""
    return prepared.prepare(synthetic, cache=tmp_path_factory.mktemp("cache"))


def snapshot(root: Path) -> dict:
    """Every path under `root` with its modification time and content."""
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def same_arrays(a: prepared.Prepared, b: prepared.Prepared) -> bool:
    return a.vocab_proto == b.vocab_proto and all(
        np.array_equal(getattr(a, side).tokens, getattr(b, side).tokens)
        and np.array_equal(getattr(a, side).offsets, getattr(b, side).offsets)
        for side in prepared.SIDES
    )


def expected_pairs(config) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The first `LIMIT` pairs as the whole-file loader keeps them (stripped, empty sides dropped)."""
    train = corpus.load_corpus(config, "train")
    assert len(train) > LIMIT  # the limit cuts the corpus
    return train.src[:LIMIT], train.tgt[:LIMIT]


# The arrays are the encoding of the corpus


@pytest.mark.parametrize("source", ["synthetic", "multi30k"])
def test_the_arrays_are_the_vocabulary_s_encoding_of_the_corpus(source, synthetic, base, tmp_path, monkeypatch):
    if source == "multi30k":
        if not os.environ.get("MULTI30K_DIR"):
            pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
        config = config_of()
        data = prepared.prepare(config, cache=tmp_path)
    else:
        config, data = synthetic, base
    src, tgt = expected_pairs(config)
    # the vocabulary is the one tokenizer.train makes of the same pairs' texts (as train.py trained it)
    assert data.vocab_proto == tokenizer.train([*src, *tgt], VOCAB, config.seed)
    vocab = tokenizer.load(data.vocab_proto)
    for side, sentences in ((data.src, src), (data.tgt, tgt)):
        encoded = vocab.encode(list(sentences))
        assert len(side) == LIMIT
        assert all(side[i].tolist() == encoded[i] for i in range(LIMIT))
        lengths = [len(ids) for ids in encoded]
        assert side.offsets.tolist() == [0, *np.cumsum(lengths).tolist()]
        assert side.tokens.dtype == np.int32 and side.offsets.dtype == np.int64
    manifest = data.manifest
    assert manifest["pairs"] == LIMIT
    assert manifest["tokens"] == {"src": len(data.src.tokens), "tgt": len(data.tgt.tokens)}
    assert manifest["tokens"] == {
        side: sum(map(len, vocab.encode(list(s)))) for side, s in (("src", src), ("tgt", tgt))
    }
    assert manifest["corpus"] == prepared.corpus_identity(config, LIMIT)
    assert manifest["vocabulary"]["sha256"] == hashlib.sha256(data.vocab_proto).hexdigest()
    for name in ARRAYS:  # the files on disk, as the manifest describes them
        path = data.directory / name
        assert manifest["arrays"][name] == {
            "bytes": path.stat().st_size,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    assert np.array_equal(np.fromfile(data.directory / "src.tokens.i32", np.int32), data.src.tokens)
    assert (data.directory / "src.tokens.i32").stat().st_size == 4 * manifest["tokens"]["src"]
    # a second prepare reads the same directory and encodes nothing
    monkeypatch.setattr(prepared, "_encode", None)
    again = prepared.prepare(config, cache=data.directory.parent)
    assert again.directory == data.directory and same_arrays(again, data)
    assert again.manifest_sha256 == hashlib.sha256((data.directory / prepared.MANIFEST).read_bytes()).hexdigest()


# A damaged or foreign directory is refused in one line, never re-tokenized


def _truncate(directory: Path) -> Path:
    path = directory / "src.tokens.i32"
    path.write_bytes(path.read_bytes()[:-4])
    return path


def _flip_byte(directory: Path, name: str = "tgt.tokens.i32") -> Path:
    path = directory / name
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0x01
    path.write_bytes(bytes(content))
    return path


def _remove(directory: Path, name: str) -> Path:
    (directory / name).unlink()
    return directory / name


def _edit_manifest(directory: Path, edit) -> Path:
    path = directory / prepared.MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return path


def _garble(directory: Path) -> Path:
    path = directory / prepared.MANIFEST
    path.write_bytes(path.read_bytes()[:-40])  # cut short: not JSON
    return path


DAMAGE = {
    "truncated_array": (_truncate, "truncated"),
    "byte_flipped_array": (_flip_byte, "sha256"),
    "byte_flipped_offsets": (lambda d: _flip_byte(d, "src.offsets.i64"), "sha256"),
    "byte_flipped_vocabulary": (lambda d: _flip_byte(d, "vocab.model"), "sha256"),
    "missing_array": (lambda d: _remove(d, "tgt.offsets.i64"), "missing"),
    "missing_manifest": (lambda d: _remove(d, prepared.MANIFEST), "missing"),
    "garbled_manifest": (_garble, "not a prepared-data manifest"),
    "manifest_without_an_array": (
        lambda d: _edit_manifest(d, lambda m: m["arrays"].pop("tgt.tokens.i32")),
        "not a prepared-data manifest",
    ),
    "another_corpus": (lambda d: _edit_manifest(d, lambda m: m["corpus"].update(limit=LIMIT + 1)), "another corpus"),
    "another_vocabulary": (
        lambda d: _edit_manifest(d, lambda m: m["vocabulary"].update(sha256="0" * 64)),
        "another vocabulary",
    ),
}


def assert_one_line_naming(error: Exception, path: Path) -> None:
    message = str(error)
    assert isinstance(error, prepared.PreparedDataError) and isinstance(error, ValueError)
    assert str(path) in message, message
    assert prepared.COMMAND in message and "prepare.py" in message, message
    assert "\n" not in message.strip(), message


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_or_foreign_directory_is_refused_in_one_line_and_never_rewritten(
    damage, synthetic, base, tmp_path, monkeypatch
):
    shutil.copytree(base.directory.parent, tmp_path, dirs_exist_ok=True)
    directory = tmp_path / base.directory.name
    harm, words = DAMAGE[damage]
    path = harm(directory)
    before = snapshot(tmp_path)

    def encode(*args, **kwargs):
        raise AssertionError("prepare encoded the corpus again")

    monkeypatch.setattr(prepared, "_encode", encode)
    ident, vocab_sha = prepared.corpus_identity(synthetic, LIMIT), hashlib.sha256(base.vocab_proto).hexdigest()
    with pytest.raises(prepared.PreparedDataError) as loading:
        prepared.load(directory, ident, vocab_sha)
    assert_one_line_naming(loading.value, path)
    assert words in str(loading.value)
    for _ in range(2):  # and again: the directory is left as it is
        with pytest.raises(prepared.PreparedDataError) as preparing:
            prepared.prepare(synthetic, cache=tmp_path)
        assert str(preparing.value) == str(loading.value)
        assert snapshot(tmp_path) == before


def test_a_directory_of_another_corpus_or_vocabulary_is_refused(synthetic, base):
    ident, vocab_sha = prepared.corpus_identity(synthetic, LIMIT), hashlib.sha256(base.vocab_proto).hexdigest()
    assert same_arrays(prepared.load(base.directory, ident, vocab_sha), base)
    other_corpus = prepared.corpus_identity(config_of(dir=synthetic.data.dir, train_limit=LIMIT - 1), LIMIT - 1)
    other_vocab = hashlib.sha256(tokenizer.train(["ein Hund", "a dog"] * 20, 20, 0)).hexdigest()
    for wrong, words in (((other_corpus, vocab_sha), "another corpus"), ((ident, other_vocab), "another vocabulary")):
        with pytest.raises(prepared.PreparedDataError, match=words) as error:
            prepared.load(base.directory, *wrong)
        assert_one_line_naming(error.value, base.directory / prepared.MANIFEST)


def test_an_edited_cached_vocabulary_that_still_loads_is_refused(synthetic, base, tmp_path):
    """Another valid SentencePiece model in the cached vocabulary's place: its digest (vocab-KEY.sha256) tells."""
    shutil.copytree(base.directory.parent, tmp_path, dirs_exist_ok=True)
    (vocab_path,) = tmp_path.glob("vocab-*.model")
    vocab_path.write_bytes(tokenizer.train(["ein hund", "a dog", "zwei katzen", "two cats"] * 50, 40, 0))
    with pytest.raises(prepared.PreparedDataError, match="edited or damaged") as error:
        prepared.prepare(synthetic, cache=tmp_path)
    assert_one_line_naming(error.value, vocab_path)


def test_a_damaged_cached_vocabulary_is_refused_not_encoded_with(synthetic, base, tmp_path, monkeypatch):
    """A vocabulary SentencePiece cannot load stops prepare in one line (its encoding workers would fail to start,
    and the pool would start them again for ever)."""
    shutil.copytree(base.directory.parent, tmp_path, dirs_exist_ok=True)
    (vocab_path,) = tmp_path.glob("vocab-*.model")
    vocab_path.write_bytes(vocab_path.read_bytes()[:100])
    before = snapshot(tmp_path)

    def encode(*args, **kwargs):
        raise AssertionError("prepare encoded with a vocabulary SentencePiece cannot load")

    monkeypatch.setattr(prepared, "_encode", encode)
    with pytest.raises(prepared.PreparedDataError) as error:
        prepared.prepare(synthetic, cache=tmp_path)
    assert_one_line_naming(error.value, vocab_path)
    assert snapshot(tmp_path) == before
    for proto in (b"not a model", b""):  # given, as a resumed run gives its own
        with pytest.raises(prepared.PreparedDataError, match="not a SentencePiece model") as error:
            prepared.prepare(synthetic, cache=tmp_path, vocab_proto=proto)
        assert "\n" not in str(error.value).strip()
        assert snapshot(tmp_path) == before


# A killed prepare leaves nothing a later run reads

KILLED = """
import importlib.util, json, sys, time
from training import prepared
from training.data import corpus

spec = importlib.util.spec_from_file_location("config_default", "configs/default.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
config = module.get_config()
for key, value in json.loads(sys.argv[1]).items():
    setattr(config.data, key, value)
read, encode = corpus.iter_pairs, prepared._encode


def stalled(*args, **kwargs):  # the encoder's read of the corpus stops half-way, its workers started
    for k, pair in enumerate(read(*args, **kwargs)):
        if k == 150:
            print("encoding", flush=True)
            time.sleep(600)
        yield pair


def encode_then_stall(*args, **kwargs):
    corpus.iter_pairs = stalled  # the vocabulary is trained by now: only the encoding stalls
    return encode(*args, **kwargs)


prepared._encode, prepared.CHUNK = encode_then_stall, 50
prepared.prepare(config, cache=sys.argv[2])
"""


def wait_for_line(proc: subprocess.Popen, line: str, seconds: float, stderr: Path) -> None:
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        if selector.select(timeout=1) and proc.stdout.readline().strip() == line:
            return
    raise AssertionError(
        f"the prepare never printed {line!r} (exit status {proc.poll()}): {stderr.read_text()[-3000:]}"
    )


def kill_group(pgid: int, seconds: float = 30) -> bool:
    """SIGKILL to every process of the group; True once none is left."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_prepare_killed_while_encoding_leaves_nothing_a_later_prepare_reads(synthetic, base, tmp_path):
    """kill -9 of the preparing process and its encoding workers (one process group) while it encodes."""
    cache = tmp_path / "cache"
    settings = {"dir": synthetic.data.dir, "train_limit": LIMIT, "vocab_size": VOCAB}
    with open(tmp_path / "stderr", "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED, json.dumps(settings), str(cache)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its own process group: the pool's workers die with it
        )
        try:
            wait_for_line(proc, "encoding", seconds=180, stderr=tmp_path / "stderr")
            partial = cache / f"{base.directory.name}.partial-{socket.gethostname()}-{proc.pid}"
            assert partial.is_dir()
            os.killpg(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=60) == -signal.SIGKILL
        finally:
            proc.stdout.close()
            assert kill_group(proc.pid)  # the encoding workers went with it
            proc.wait()
    (vocab_path,) = cache.glob("vocab-*.model")
    assert vocab_path.read_bytes() == base.vocab_proto
    digest = vocab_path.with_suffix(".sha256")
    assert sorted(p.name for p in cache.iterdir()) == sorted([vocab_path.name, digest.name, partial.name])
    assert not (cache / base.directory.name).exists()
    with pytest.raises(prepared.PreparedDataError, match="missing"):
        prepared.load(partial)
    data = prepared.prepare(synthetic, cache=cache)  # a later run prepares it whole
    assert data.directory == cache / base.directory.name
    assert same_arrays(data, base) and same_arrays(prepared.load(data.directory), base)
    assert data.manifest["arrays"] == base.manifest["arrays"]
    assert not partial.exists()  # what the killed prepare left is removed by the next one on this host


def test_an_interrupted_prepare_removes_what_it_wrote(synthetic, base, tmp_path, monkeypatch):
    encode, seen = prepared._encode, []

    def interrupted(config, directory, vocab_proto, limit):
        encode(config, directory, vocab_proto, limit)
        seen.append(sorted(p.name for p in directory.iterdir()))
        raise KeyboardInterrupt  # once the arrays are written, before the manifest

    monkeypatch.setattr(prepared, "_encode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepared.prepare(synthetic, cache=tmp_path)
    assert seen == [sorted(ARRAYS)]
    (vocab_path,) = tmp_path.glob("vocab-*.model")
    # no partial directory, no final one: the vocabulary and its digest alone
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([vocab_path.name, vocab_path.stem + ".sha256"])
    monkeypatch.setattr(prepared, "_encode", encode)
    data = prepared.prepare(synthetic, cache=tmp_path)
    assert data.directory.name == base.directory.name and same_arrays(data, base)


# A tfds corpus is streamed


@functools.cache
def tiny_translate():
    """A tfds translation builder of a local file (`manual_dir`/pairs.tsv, German TAB English), registered as
    'headcount_tiny_translate': `tfds.load` prepares and reads it with no download."""
    import tensorflow_datasets as tfds

    class HeadcountTinyTranslate(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")
        MANUAL_DOWNLOAD_INSTRUCTIONS = "pairs.tsv: one German TAB English pair a line"

        def _info(self):
            features = tfds.features.Translation(languages=("de", "en"))
            return tfds.core.DatasetInfo(builder=self, features=features, disable_shuffling=True)

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(dl_manager.manual_dir / "pairs.tsv")}

        def _generate_examples(self, path):
            for i, line in enumerate(path.read_text(encoding="utf-8").split("\n")):
                de, en = line.split("\t")
                yield i, {"de": de, "en": en}

    return HeadcountTinyTranslate


def test_a_tfds_corpus_is_streamed_and_prepared(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    de, en = synthetic_lines("de", 0)[:60], synthetic_lines("en", 1)[:60]
    (tmp_path / "manual").mkdir()
    (tmp_path / "manual" / "pairs.tsv").write_text(
        "\n".join(f"{s.replace(chr(9), ' ')}\t{t.replace(chr(9), ' ')}" for s, t in zip(de, en)), encoding="utf-8"
    )
    builder = tiny_translate()(data_dir=str(tmp_path / "tfds"))
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(tmp_path / "manual")))
    kept = [(s.replace("\t", " ").strip(), t.replace("\t", " ").strip()) for s, t in zip(de, en)]
    kept = [(s, t) for s, t in kept if s and t]
    limit = 40
    assert len(kept) > limit and kept[0] == (de[0].strip(), en[0].strip())
    config = config_of(dataset="headcount_tiny_translate", dir=str(tmp_path / "tfds"), train_limit=limit)

    pulled, as_numpy = [], tfds.as_numpy

    def counted(dataset):
        for example in as_numpy(dataset):
            pulled.append(example)
            yield example

    monkeypatch.setattr(tfds, "as_numpy", counted)
    pairs = corpus.iter_pairs(config, "train")
    assert inspect.isgenerator(pairs) and not pulled
    assert next(pairs) == kept[0] and len(pulled) == 1  # the first pair before a second example is read
    assert [kept[0], *pairs] == kept and len(pulled) == len(de)
    pulled.clear()
    assert list(corpus.iter_pairs(config, "train", limit)) == kept[:limit]
    assert len(pulled) == 1 + next(i for i, (s, t) in enumerate(zip(de, en)) if [s, t] == list(kept[limit - 1]))

    data = prepared.prepare(config, cache=tmp_path / "cache")
    src, tgt = zip(*kept[:limit], strict=True)
    assert data.vocab_proto == tokenizer.train([*src, *tgt], VOCAB, config.seed)
    vocab = tokenizer.load(data.vocab_proto)
    for side, sentences in ((data.src, src), (data.tgt, tgt)):
        encoded = vocab.encode(list(sentences))
        assert [side[i].tolist() for i in range(len(side))] == encoded
    assert data.manifest["pairs"] == limit and data.manifest["corpus"]["dataset"] == "headcount_tiny_translate"


# Processes that gather their own rows gather the global batch


@pytest.mark.parametrize("pack_length", [0, 64], ids=["bucketed", "packed"])
def test_the_rows_of_every_process_together_are_the_global_batch(pack_length, synthetic, base):
    settings = dict(token_budget=384, bucket_lengths=synthetic.data.bucket_lengths, seed=3, pack_length=pack_length)
    whole = BatchSchedule(base.src, base.tgt, **settings)
    steps = 50
    assert whole.batches_per_epoch < steps  # the steps cross epochs
    padded = 0
    for hosts in (1, 2, 4, 8):
        schedules = [BatchSchedule(base.src, base.tgt, **settings) for _ in range(hosts)]  # one a process
        for step in range(steps):
            batch = as_arrays(whole.batch(step))
            rows, length = whole.shape(step)
            assert batch["src"].shape == (rows, length)
            share = -(-rows // hosts)
            parts = [as_arrays(s.batch(step, rows=(h * share, (h + 1) * share))) for h, s in enumerate(schedules)]
            expected = {"src", "tgt_in", "tgt_out", "weights", *(PACKING_FIELDS if pack_length else ())}
            assert set(batch) == expected and all(set(p) == expected for p in parts)
            for name, array in batch.items():
                assert all(p[name].shape == (share, length) and p[name].dtype == array.dtype for p in parts)
                joined = np.concatenate([p[name] for p in parts])
                np.testing.assert_array_equal(joined[:rows], array)
                assert not joined[rows:].any() and PAD_ID == 0  # rows past the batch's: padding, weight 0
            padded += share * hosts > rows
    assert padded > 0


def _worker_that_cannot_start(model_proto):
    """An encoding worker's initializer that fails, as one whose imports or memory fail would."""
    raise SystemExit(3)


def test_encoding_workers_that_cannot_start_stop_the_prepare_instead_of_hanging(synthetic, tmp_path, monkeypatch):
    monkeypatch.setattr(prepared.encoding, "start", _worker_that_cannot_start)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the encoding workers stopped"):
        prepared.prepare(synthetic, cache=tmp_path)
    assert time.monotonic() - started < 120
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no final directory, no partial one


def test_a_worker_reimporting_an_unguarded_script_is_told_what_to_do(monkeypatch):
    # a spawned encoding worker re-imports the caller's main module; a script without the guard calls prepare
    # again there, which must stop with the fix named instead of waiting on its parent's directory
    import multiprocessing

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match=r"spawned encoding worker imported the main module: .*__main__"):
        prepared.prepare(None)
