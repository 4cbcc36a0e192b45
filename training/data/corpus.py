"""Parallel text corpora: Multi30k from gzip files (downloaded when missing), WMT through tfds.

Every loader returns a `Corpus`: aligned source/target sentences plus the count of pairs it
dropped and why, so that nothing disappears without showing up in the log.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
MULTI30K_LANGUAGES = ("en", "de", "fr", "cs")
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Aligned sentence pairs; `dropped` maps a reason to the number of pairs removed for it."""

    src: tuple[str, ...]
    tgt: tuple[str, ...]
    dropped: dict[str, int]

    def __len__(self) -> int:
        return len(self.src)


def default_multi30k_dir() -> Path:
    """`$MULTI30K_DIR` if set, else a cache directory under the user's home."""
    if os.environ.get("MULTI30K_DIR"):
        return Path(os.environ["MULTI30K_DIR"])
    return Path.home() / ".cache" / "headcount" / "multi30k"


def check_split(config, split: str, name: str) -> None:
    """ValueError naming `name` (a flag or config field) unless `split` is one of Multi30k's (tfds names are left
    to tfds)."""
    if config.data.dataset == "multi30k" and split not in MULTI30K_SPLITS:
        raise ValueError(f"{name} = {split!r}; expected one of Multi30k's splits {MULTI30K_SPLITS}")


def load_multi30k(data_dir: str | Path, split: str, src: str, tgt: str, *, download: bool = True) -> Corpus:
    """Read `{split}.{src}.gz` / `{split}.{tgt}.gz` from `data_dir`, fetching missing files first."""
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"data split must be one of {MULTI30K_SPLITS}, got {split!r}")
    for field, lang in (("data.src", src), ("data.tgt", tgt)):
        if lang not in MULTI30K_LANGUAGES:
            raise ValueError(f"{field} must be one of {MULTI30K_LANGUAGES}, got {lang!r}")
    if src == tgt:
        raise ValueError(f"data.src and data.tgt must differ, both are {src!r}")
    data_dir = Path(data_dir)
    paths = [data_dir / f"{split}.{lang}.gz" for lang in (src, tgt)]
    for path in paths:
        if not path.exists():
            _fetch(path, download)
    return read_parallel(*paths)


def _fetch(path: Path, download: bool) -> None:
    hint = (
        f"Multi30k file {path} is missing. Put a copy of the raw task-1 files "
        "({train,val,test_2016_flickr}.{en,de,fr,cs}.gz) there, or point at one with "
        "MULTI30K_DIR=/path/to/multi30k or --config.data.dir=/path/to/multi30k"
    )
    if not download:
        raise FileNotFoundError(hint)
    url = MULTI30K_URL.format(name=path.name)
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            content = response.read()
        path.parent.mkdir(parents=True, exist_ok=True)  # only now: a failed download leaves no empty directory
        partial = path.with_suffix(".gz.part")
        partial.write_bytes(content)
        partial.replace(path)  # never leave a truncated file under the final name
    except (urllib.error.URLError, OSError) as error:
        raise FileNotFoundError(f"{hint}. Downloading {url} failed: {error}") from None


def read_parallel(src_path: Path, tgt_path: Path) -> Corpus:
    """Aligned gzip text files, one sentence per line; pairs with an empty side are dropped and counted."""
    src_lines, tgt_lines = _read_lines(src_path), _read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise ValueError(f"misaligned corpus: {src_path} has {len(src_lines)} lines, {tgt_path} has {len(tgt_lines)}")
    return _pair_up(src_lines, tgt_lines)


def _pair_up(src_lines, tgt_lines) -> Corpus:
    """Strip both sides; drop (and count) pairs with an empty side."""
    pairs = [(s.strip(), t.strip()) for s, t in zip(src_lines, tgt_lines, strict=True)]
    kept = [(s, t) for s, t in pairs if s and t]
    return Corpus(
        src=tuple(s for s, _ in kept),
        tgt=tuple(t for _, t in kept),
        dropped={"empty": len(pairs) - len(kept)},
    )


def _read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (gzip.BadGzipFile, EOFError, OSError) as error:
        raise ValueError(
            f"{path} is not a readable {'gzip' if path.suffix == '.gz' else 'text'} file ({error})"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise ValueError(f"{path} is not UTF-8 (line {line}: {error.reason})") from None
    return text.splitlines()


def load_tfds(name: str, split: str, src: str, tgt: str, data_dir: str | None = None) -> Corpus:
    """A translation dataset from tensorflow-datasets, e.g. `wmt14_translate/de-en` (dev and test splits: small).

    Needs TensorFlow (`pip install -e .[wmt]`): the WMT builders import it.
    """
    pairs = list(iter_tfds(name, split, src, tgt, data_dir))
    return _pair_up([s for s, _ in pairs], [t for _, t in pairs])


def iter_tfds(name: str, split: str, src: str, tgt: str, data_dir: str | None = None) -> Iterator[tuple[str, str]]:
    """A tfds translation split's (source, target) pairs as they come, unstripped: nothing is held in memory."""
    import tensorflow_datasets as tfds

    for example in tfds.as_numpy(tfds.load(name, split=split, data_dir=data_dir)):
        yield example[src].decode("utf-8"), example[tgt].decode("utf-8")


def tfds_version(name: str, data_dir: str | None = None) -> str:
    """The version of the tfds dataset `name` (in `data_dir`) that `iter_tfds` reads."""
    import tensorflow_datasets as tfds

    return str(tfds.builder(name, data_dir=data_dir).version)


def _iter_lines(path: Path) -> Iterator[str]:
    """`path`'s lines one at a time, split as str.splitlines splits the whole text (so as `read_parallel` reads)."""
    opener = gzip.open if path.suffix == ".gz" else open
    number = 0
    try:
        with opener(path, "rb") as f:
            for raw in f:
                number += 1
                yield from raw.decode("utf-8").splitlines() or [""]
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 (line {number}: {error.reason})") from None
    except (gzip.BadGzipFile, EOFError, OSError) as error:
        raise ValueError(
            f"{path} is not a readable {'gzip' if path.suffix == '.gz' else 'text'} file ({error})"
        ) from None


def iter_pairs(config, split: str, limit: int = 0) -> Iterator[tuple[str, str]]:
    """`split`'s stripped pairs with both sides non-empty, streamed (`load_corpus`'s pairs in its order, the first
    `limit` of them where limit > 0): a corpus of any size is read without holding it."""
    if config.data.dataset == "multi30k":
        src_path, tgt_path = multi30k_paths(config, split)
        raw = itertools.zip_longest(_iter_lines(src_path), _iter_lines(tgt_path))
    else:
        raw = iter_tfds(config.data.dataset, split, config.data.src, config.data.tgt, config.data.dir or None)
    kept = 0
    for s, t in raw:
        if s is None or t is None:
            raise ValueError(f"misaligned corpus: {src_path} and {tgt_path} have different numbers of lines")
        s, t = s.strip(), t.strip()
        if s and t:
            yield s, t
            kept += 1
            if kept == limit:
                return


def multi30k_paths(config, split: str) -> tuple[Path, Path]:
    """The two gzip files of a Multi30k `split` (fetched first where missing), as `load_multi30k` reads them."""
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"data split must be one of {MULTI30K_SPLITS}, got {split!r}")
    paths = tuple(data_dir(config) / f"{split}.{lang}.gz" for lang in (config.data.src, config.data.tgt))
    for path in paths:
        if not path.exists():
            _fetch(path, True)
    return paths  # type: ignore[return-value]


def data_dir(config) -> Path:
    """The Multi30k directory a run's config names: `data.dir`, else `default_multi30k_dir()`."""
    return Path(config.data.dir) if config.data.dir else default_multi30k_dir()


def load_corpus(config, split: str) -> Corpus:
    """`split` of the dataset `config.data` names (Multi30k or tfds), `data.src` -> `data.tgt`."""
    if config.data.dataset == "multi30k":
        return load_multi30k(data_dir(config), split, config.data.src, config.data.tgt)
    return load_tfds(config.data.dataset, split, config.data.src, config.data.tgt, config.data.dir or None)
