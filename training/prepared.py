"""Training data prepared once: the vocabulary trained and the training split encoded into flat token arrays.

A run reads its training split as two memory-mapped arrays a side (`Tokens`: the token ids end to end, and
where each sentence starts) from a directory of the prepared-data cache, described by `manifest.json`: the
corpus files and their hashes, the vocabulary's settings and hash, the counts, the arrays' sizes and hashes,
and the code that wrote them. Every run and sweep point on the same corpus and vocabulary reads the same
directory; the first to need it prepares it (`prepare`), or `python prepare.py --config C` does
beforehand. A directory appears under its final name only once complete (written aside, then renamed), so a
killed prepare leaves nothing a run would read; a damaged or foreign one is refused in one line naming the file
and what to run, and is never silently re-tokenized.

The cache is `$HEADCOUNT_PREPARED`, else ~/.cache/headcount/prepared:
    vocab-KEY.model        a vocabulary trained on a corpus with given settings (KEY: their hash)
    DATASET-KEY/           a corpus encoded with one vocabulary (KEY: the corpus's and the vocabulary's hash)
        manifest.json, {src,tgt}.tokens.i32, {src,tgt}.offsets.i64, packing-seedS-lenN-openK.npz (packing plans)

The vocabulary is the one `tokenizer.train` makes of the same texts in the same order (all sources, then all
targets), so runs on Multi30k train on the vocabulary and batches they always did (tests/training/data).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from training.core import files, provenance
from training.data import corpus, encoding, tokenizer
from training.data.batching import OPEN_ROWS, BatchSchedule, Tokens

FORMAT = 1  # the layout below; a new one is a new key (old directories stay readable by the code that wrote them)
ENV = "HEADCOUNT_PREPARED"
MANIFEST = "manifest.json"
SIDES = ("src", "tgt")
CHUNK = 20_000  # sentences a worker encodes at a time
COMMAND = "python prepare.py --config CONFIG"


class PreparedDataError(ValueError):
    """Prepared data that cannot be used as it is: damaged, incomplete, or of another corpus or vocabulary."""


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A prepared training split: its directory, manifest (and the manifest file's SHA-256), vocabulary, tokens."""

    directory: Path
    manifest: dict
    manifest_sha256: str
    vocab_proto: bytes
    src: Tokens
    tgt: Tokens


def cache_root(cache: str | Path | None = None) -> Path:
    """`cache`, else $HEADCOUNT_PREPARED, else ~/.cache/headcount/prepared."""
    if cache:
        return Path(cache)
    return Path(os.environ.get(ENV) or Path.home() / ".cache" / "headcount" / "prepared")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _key(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:20]


def corpus_identity(config, limit: int) -> dict:
    """What fixes the training pairs: the dataset, languages, split, the pair limit, and for files their hashes."""
    ident = {
        "dataset": config.data.dataset,
        "split": config.data.train_split,
        "src": config.data.src,
        "tgt": config.data.tgt,
        "limit": limit,
    }
    if config.data.dataset == "multi30k":
        paths = corpus.multi30k_paths(config, config.data.train_split)
        ident["files"] = [{"name": p.name, "bytes": p.stat().st_size, "sha256": _sha256(p)} for p in paths]
    else:  # tfds: the copy read (its data_dir) and the builder's version
        ident |= {"dir": config.data.dir, "version": corpus.tfds_version(config.data.dataset, config.data.dir or None)}
    return ident


def texts(config, limit: int) -> Iterator[str]:
    """The vocabulary's training texts, as `tokenizer.train` has always been given them: every source, then every
    target, of the kept pairs (streamed twice, never held)."""
    for side in (0, 1):
        yield from (pair[side] for pair in corpus.iter_pairs(config, config.data.train_split, limit))


def vocabulary(
    config, seed: int, cache: str | Path | None = None, limit: int | None = None, ident: dict | None = None
) -> bytes:
    """The vocabulary `tokenizer.train` makes of the training split with `config.data.vocab_size` and `seed`,
    trained on first use and kept in the cache (vocab-KEY.model, its SHA-256 beside it in vocab-KEY.sha256).
    limit: pairs (default `data.train_limit`); ident: `corpus_identity(config, limit)`, where already known."""
    limit = config.data.train_limit if limit is None else limit
    ident = corpus_identity(config, limit) if ident is None else ident
    settings = {"format": FORMAT, "vocab_size": config.data.vocab_size, "seed": seed}
    path = cache_root(cache) / f"vocab-{_key({**ident, **settings})}.model"
    digest = path.with_suffix(".sha256")
    if path.exists():
        proto, redo = path.read_bytes(), f"delete {path} and run `{COMMAND}` to train it again"
        if not digest.is_file() or digest.read_text().strip() != hashlib.sha256(proto).hexdigest():
            raise PreparedDataError(f"{path} does not match {digest.name} (edited or damaged); {redo}")
        _check_vocabulary(proto, f"{path} is not a SentencePiece model; {redo}")
        return proto
    if next(corpus.iter_pairs(config, config.data.train_split, limit), None) is None:  # SentencePiece would raise
        raise ValueError(f"config.data.train_split {config.data.train_split!r} has no sentence pairs")
    started = time.monotonic()
    proto = tokenizer.train(texts(config, limit), config.data.vocab_size, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(digest, hashlib.sha256(proto).hexdigest() + "\n")  # first: a model is never unverifiable
    files.write_atomic(path, proto)
    logging.info("vocabulary trained in %.0fs: %s", time.monotonic() - started, path)
    return proto


def prepare(
    config, cache: str | Path | None = None, vocab_proto: bytes | None = None, vocab_seed: int | None = None
) -> Prepared:
    """The training split of `config` encoded with `vocab_proto` (else the vocabulary trained with `vocab_seed`,
    default `config.seed`, as train.py trains it): read from the cache, or prepared now and then read."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # an encoding worker (spawned) re-imports the caller's main module: without the guard that module's
        # top level calls this again, and the worker would wait on its parent's half-written directory
        raise RuntimeError(
            "training.prepared.prepare was called while a spawned encoding worker imported the main module: "
            "put the script's top-level code under `if __name__ == '__main__':`"
        )
    root = cache_root(cache)
    limit = config.data.train_limit
    ident = corpus_identity(config, limit)
    trained = None
    if vocab_proto is None:
        trained = {"vocab_size": config.data.vocab_size, "seed": config.seed if vocab_seed is None else vocab_seed}
        vocab_proto = vocabulary(config, trained["seed"], root, limit, ident)
    vocab = {"sha256": hashlib.sha256(vocab_proto).hexdigest(), "trained": trained}
    key = _key({"format": FORMAT, **ident, "vocab": vocab["sha256"]})
    directory = root / f"{config.data.dataset.replace('/', '_')}-{key}"
    if not directory.exists():
        _write(config, directory, ident, vocab, vocab_proto)
    return load(directory, ident, vocab["sha256"])


def _write(config, directory: Path, ident: dict, vocab: dict, vocab_proto: bytes) -> None:
    """Encode the training split into `directory`, written aside and renamed into place once complete."""
    started = time.monotonic()
    _check_vocabulary(vocab_proto, f"the vocabulary to encode {directory} with is not a SentencePiece model")
    _remove_dead_partials(directory)
    partial = directory.with_name(f"{directory.name}.partial-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        counts = _encode(config, partial, vocab_proto, ident["limit"])
        (partial / "vocab.model").write_bytes(vocab_proto)
        manifest = {
            "format": FORMAT,
            "corpus": ident,
            "vocabulary": vocab,
            **counts,
            "arrays": {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in _arrays(partial)},
            "code": {**provenance.git_commit(), **provenance.environment()},
            "seconds": round(time.monotonic() - started, 1),
        }
        files.write_atomic(partial / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        try:
            partial.rename(directory)
        except OSError:  # another process prepared the same directory first: its copy is the same data
            if not (directory / MANIFEST).exists():
                raise
            shutil.rmtree(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    logging.info("prepared %s in %.0fs", directory, time.monotonic() - started)


def _remove_dead_partials(directory: Path) -> None:
    """Remove what killed prepares of `directory` on this host left (DIR.partial-HOST-PID whose process is gone);
    another host's, or a live process's, is left alone."""
    host = socket.gethostname()
    for partial in directory.parent.glob(f"{directory.name}.partial-{host}-*"):
        pid = partial.name.rpartition("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(partial, ignore_errors=True)
            logging.info("removed %s, left by a prepare that was killed", partial)


def _check_vocabulary(proto: bytes, refusal: str) -> None:
    """PreparedDataError(refusal) unless SentencePiece loads `proto` and encodes with it: an encoding worker that
    cannot load it would fail to start, and the pool would start it again for ever."""
    try:
        tokenizer.load(proto).encode("a")  # an empty proto loads, but cannot encode
    except RuntimeError:
        raise PreparedDataError(refusal) from None


def _arrays(directory: Path) -> list[Path]:
    return [directory / f"{side}.{part}" for side in SIDES for part in ("tokens.i32", "offsets.i64")]


def _encode(config, directory: Path, vocab_proto: bytes, limit: int) -> dict:
    """Both sides of the kept pairs encoded by one worker a core, in order, appended to the arrays.

    At most two chunks a worker are in flight (the corpus is read as the workers take it, never queued whole);
    a worker that cannot start or dies stops the prepare with an error (a `multiprocessing.Pool` would start it
    again for ever).
    """
    pairs = corpus.iter_pairs(config, config.data.train_split, limit)
    chunks = iter(lambda: list(itertools.islice(pairs, CHUNK)), [])
    # each chunk's sources, then its targets: result k is of side k % 2
    texts = ([pair[i] for pair in chunk] for chunk in chunks for i in range(len(SIDES)))
    tokens = {side: open(directory / f"{side}.tokens.i32", "wb") for side in SIDES}
    lengths: dict[str, list[np.ndarray]] = {side: [] for side in SIDES}
    context = multiprocessing.get_context("spawn")  # a forked JAX process can deadlock; workers import no JAX
    workers = max(1, min(len(os.sched_getaffinity(0)), 16))
    done = 0

    def collect(future) -> None:
        nonlocal done
        flat, counts = future.result()
        tokens[SIDES[done % 2]].write(flat)
        lengths[SIDES[done % 2]].append(counts)
        done += 1

    try:
        with ProcessPoolExecutor(workers, context, initializer=encoding.start, initargs=(vocab_proto,)) as pool:
            pending: collections.deque = collections.deque()
            for text in texts:
                pending.append(pool.submit(encoding.encode, text))
                if len(pending) >= 2 * workers:
                    collect(pending.popleft())
            while pending:
                collect(pending.popleft())
    except BrokenProcessPool as error:
        raise RuntimeError(f"the encoding workers stopped ({error}): see the log above for why") from None
    finally:
        for f in tokens.values():
            f.close()
    result = {"pairs": 0, "tokens": {}}
    for side in SIDES:
        per_sentence = np.concatenate(lengths[side]) if lengths[side] else np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(per_sentence)]).astype(np.int64)
        offsets.tofile(directory / f"{side}.offsets.i64")
        result["pairs"], result["tokens"][side] = len(per_sentence), int(offsets[-1])
    return result


def load(directory: Path, corpus_ident: dict | None = None, vocab_sha256: str | None = None) -> Prepared:
    """The prepared data in `directory`, checked: the manifest (of this corpus and vocabulary, where given) and
    every array's size and hash. A PreparedDataError names the file and what to run."""
    manifest_path = directory / MANIFEST
    redo = f"delete {directory} and run `{COMMAND}` to prepare it again"
    if not manifest_path.is_file():
        raise PreparedDataError(f"{manifest_path} is missing: {directory} is not prepared data; {redo}")
    raw = manifest_path.read_bytes()
    try:
        manifest = json.loads(raw)
        arrays, vocab = manifest["arrays"], manifest["vocabulary"]
        if any("sha256" not in arrays[path.name] for path in _arrays(directory)) or "sha256" not in vocab:
            raise KeyError("sha256")  # an array, or the vocabulary, not described
    except (ValueError, KeyError, TypeError):
        raise PreparedDataError(f"{manifest_path} is not a prepared-data manifest; {redo}") from None
    if corpus_ident is not None and manifest.get("corpus") != corpus_ident:
        raise PreparedDataError(
            f"{manifest_path} describes another corpus ({manifest.get('corpus')}, expected {corpus_ident}); {redo}"
        )
    if vocab_sha256 is not None and vocab.get("sha256") != vocab_sha256:
        raise PreparedDataError(
            f"{manifest_path} was encoded with another vocabulary (sha256 {vocab.get('sha256')}, expected "
            f"{vocab_sha256}); {redo}"
        )
    for path in [*_arrays(directory), directory / "vocab.model"]:
        expected = arrays.get(path.name) if path.name != "vocab.model" else {"sha256": vocab.get("sha256")}
        if not path.is_file():
            raise PreparedDataError(f"{path} is missing; {redo}")
        if "bytes" in expected and path.stat().st_size != expected["bytes"]:
            raise PreparedDataError(
                f"{path} has {path.stat().st_size} bytes, its manifest {expected['bytes']} (truncated?); {redo}"
            )
        if _sha256(path) != expected["sha256"]:
            raise PreparedDataError(f"{path} does not match its manifest's sha256 (edited or damaged); {redo}")
    sides = {}
    for side in SIDES:
        offsets = np.fromfile(directory / f"{side}.offsets.i64", dtype=np.int64)
        tokens = np.memmap(directory / f"{side}.tokens.i32", dtype=np.int32, mode="r")
        sides[side] = Tokens(tokens, offsets)
    return Prepared(
        directory,
        manifest,
        hashlib.sha256(raw).hexdigest(),
        (directory / "vocab.model").read_bytes(),
        sides["src"],
        sides["tgt"],
    )


def schedule(config, data: Prepared) -> BatchSchedule:
    """The run's batch schedule over `data`; a packed one's plan read from (or computed once into) the directory."""
    settings = dict(
        token_budget=config.data.token_budget,
        bucket_lengths=config.data.bucket_lengths,
        seed=config.seed,
        pack_length=config.data.pack_length,
    )
    if not config.data.pack_length:
        return BatchSchedule(data.src, data.tgt, **settings)
    path = data.directory / f"packing-seed{config.seed}-len{config.data.pack_length}-open{OPEN_ROWS}.npz"
    if path.exists():
        return BatchSchedule(data.src, data.tgt, **settings, packed_rows=_packing(path, len(data.src)))
    result = BatchSchedule(data.src, data.tgt, **settings)
    ids, offsets = result.packed_rows
    try:
        _write_npz(path, ids=ids, offsets=offsets)
    except OSError as error:  # a read-only cache still trains: the plan is recomputed by the next run
        logging.warning("packing plan not cached (%s)", error)
    return result


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(partial, "wb") as f:
        np.savez(f, **arrays)
    partial.replace(path)


def _packing(path: Path, pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """A cached packing plan, checked: every row's example ids in range, each example at most once."""
    try:
        with np.load(path) as saved:
            ids, offsets = saved["ids"], saved["offsets"]
    except (OSError, ValueError, KeyError) as error:
        raise PreparedDataError(
            f"{path} is not a packing plan ({error}); delete it (a run computes it again)"
        ) from error
    sound = (
        offsets.ndim == 1
        and len(offsets) >= 1
        and offsets[0] == 0
        and offsets[-1] == len(ids)
        and np.all(np.diff(offsets) > 0)
        and (len(ids) == 0 or (ids.min() >= 0 and ids.max() < pairs))
        and (len(ids) == 0 or np.bincount(ids, minlength=pairs).max() == 1)
    )
    if not sound:
        raise PreparedDataError(f"{path} is not a packing plan of this data; delete it (a run computes it again)")
    return ids, offsets
