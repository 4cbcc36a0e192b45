"""A synthetic WMT14-sized de-en corpus in Multi30k's file layout, for timing the input pipeline at that size.

    python -m bench.make_corpus --pairs 4500000 --out /tmp/wmt_sized    # reads $MULTI30K_DIR

Each training line joins two Multi30k training sentences drawn at random (seeded), the same two on both sides
(German with German, English with English), so the pairs stay aligned and a side has ~24 words, about a WMT14
sentence's length. val and test_2016_flickr are copied from Multi30k. The lines are made and compressed a chunk
at a time (never held), each side in its own thread (zlib releases the GIL); the gzip headers carry no time,
so a seed gives the same bytes. bench/input_pipeline.py times prepare, batches and prefetch on it.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np

from training.core.markdown import markdown_table

LANGUAGES = ("de", "en")
COPIED = ("val", "test_2016_flickr")
CHUNK = 200_000  # lines made and written at a time


def sentences(source: Path, language: str) -> np.ndarray:
    """Multi30k's training sentences of `language`, stripped (an object array, to index by the thousand)."""
    with gzip.open(source / f"train.{language}.gz", "rt", encoding="utf-8") as f:
        return np.array([line.strip() for line in f], dtype=object)


def draws(pairs: int, sentences_count: int, seed: int):
    """(first, second) sentence indices of each line, CHUNK lines at a time."""
    rng = np.random.default_rng(seed)
    for start in range(0, pairs, CHUNK):
        yield rng.integers(0, sentences_count, size=(2, min(CHUNK, pairs - start)))


def write_side(path: Path, text: np.ndarray, chunks, level: int) -> None:
    """Lines `text[a] + " " + text[b]` for each chunk's (a, b), gzip-compressed into `path` (written aside)."""
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=level, mtime=0) as f:
        for first, second in chunks:
            f.write(("\n".join(text[first] + " " + text[second]) + "\n").encode())
    partial.replace(path)


def make(source: Path, out: Path, pairs: int, seed: int, level: int) -> dict:
    """Write the corpus; {file: bytes}."""
    text = {language: sentences(source, language) for language in LANGUAGES}
    if len(text["de"]) != len(text["en"]):
        raise ValueError(f"misaligned Multi30k in {source}: {len(text['de'])} de, {len(text['en'])} en lines")
    out.mkdir(parents=True, exist_ok=True)
    for split in COPIED:
        for language in LANGUAGES:
            shutil.copyfile(source / f"{split}.{language}.gz", out / f"{split}.{language}.gz")
    # each side's thread draws the same indices from its own generator of the same seed: the pairs stay aligned
    threads, errors = [], []
    for language in LANGUAGES:

        def run(language=language):
            try:
                write_side(out / f"train.{language}.gz", text[language], draws(pairs, len(text[language]), seed), level)
            except BaseException as error:  # raised in the main thread below
                errors.append(error)

        threads.append(threading.Thread(target=run, name=f"write-{language}"))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return {p.name: p.stat().st_size for p in sorted(out.glob("*.gz"))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4_500_000, help="training pairs (WMT14 de-en: ~4.5M)")
    parser.add_argument("--out", required=True, help="the corpus directory (CORPUS_DIR)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level", type=int, default=6, help="gzip compression level")
    parser.add_argument(
        "--multi30k", default=os.environ.get("MULTI30K_DIR", ""), help="Multi30k's raw files (default $MULTI30K_DIR)"
    )
    args = parser.parse_args(argv)
    if not args.multi30k:
        parser.error("set $MULTI30K_DIR or --multi30k to Multi30k's {train,val,test_2016_flickr}.{de,en}.gz")
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs}: expected at least 1")
    started = time.perf_counter()
    sizes = make(Path(args.multi30k), Path(args.out), args.pairs, args.seed, args.level)
    print(markdown_table(["file", "MB"], [[name, f"{size / 1e6:.2f}"] for name, size in sizes.items()], "lr"))
    print(f"\n{args.pairs:,} pairs, {sum(sizes.values()) / 1e6:.0f} MB, in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
