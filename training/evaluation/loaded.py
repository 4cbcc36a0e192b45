"""A trained run read back from its workdir: config, vocabulary, model and the parameters to use."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import ml_collections
import sentencepiece as spm

from models import Transformer
from training import checkpoints, config as config_lib
from training.core import precision, step as step_lib


@dataclasses.dataclass(frozen=True)
class LoadedRun:
    """What eval.py, sweeps and analyses work on; `step` is the checkpoint's step, `checkpoint` its folder."""

    config: ml_collections.ConfigDict
    vocab: spm.SentencePieceProcessor
    model: Transformer
    params: Any
    step: int
    checkpoint: Path | None = None


def load_run(workdir: str | Path, cache: Path | None = None) -> LoadedRun:
    """The run in `workdir`, best checkpoint first (else the latest); reading it writes nothing there.

    cache: the caller's compilation cache (where an 'auto' dtype's check is kept), never the one the workdir's
    config.json names: a workdir from elsewhere does not choose where this process reads compiled programs from.
    """
    workdir = Path(workdir)
    for name in ("config.json", "spm.model"):
        if not (workdir / name).exists():
            raise FileNotFoundError(f"{workdir / name} is missing: is {workdir} a train.py workdir?")
    config = config_lib.load_saved(workdir / "config.json")
    config.data.bucket_lengths = tuple(config.data.bucket_lengths)
    vocab = spm.SentencePieceProcessor(model_file=str(workdir / "spm.model"))
    # the dtype the run trained in (WORKDIR/run_info.json), not this machine's 'auto' verdict
    dtype, _ = precision.run_dtype(config.model.dtype, workdir, cache, matmul=config.model.matmul)
    model = config_lib.build_model(config, vocab, dtype)
    abstract = step_lib.abstract_state(model, config)
    ckpts = checkpoints.Checkpoints(workdir, config.keep_checkpoints, read_only=True)
    state, step, folder = ckpts.restore_for_eval(abstract)
    ckpts.close()
    if state is None:
        raise FileNotFoundError(f"no readable checkpoint in {workdir}/best or {workdir}/checkpoints")
    return LoadedRun(config, vocab, model, state.params, step, folder / str(step))
