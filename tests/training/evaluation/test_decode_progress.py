"""A split's decode counted on a bar, batch by batch, where stderr is a terminal; the translations as without it."""

import io
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from training.core import progress
from training.data.batching import PAD_ID
from training.evaluation import translate

EOS = 2


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def echo(monkeypatch):
    """A model whose decode gives back its padded sources (so each translation is its source), decoded in batches."""
    monkeypatch.setattr(translate, "decoder", lambda *args, **kwargs: lambda params, src, *limit: np.asarray(src))
    model = SimpleNamespace(config=SimpleNamespace(eos_id=EOS, pad_id=PAD_ID, max_len=64))
    rng = np.random.default_rng(0)
    src = [[int(t) for t in rng.integers(3, 40, n)] for n in rng.integers(1, 30, 150)]
    return model, src


def decode(model, src, label):
    return translate.translate(
        model, None, src, beam_size=4, alpha=0.6, max_extra_length=5, bucket_lengths=(8, 16, 32), progress=label
    )


def test_the_decode_counts_its_sentences_batch_by_batch(echo, monkeypatch):
    model, src = echo
    counts = []

    class Counted(progress.Bar):
        def update(self, n=1):
            super().update(n)
            counts.append(self.n)

    monkeypatch.setattr(translate, "Bar", Counted)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert decode(model, src, "translating test (beam 4)") == src  # each sentence back in its place
    assert counts == [64, 128, 150]  # 150 sentences, 64 a batch
    assert terminal.getvalue().split("\r")[-1].startswith("translating test (beam 4): 100%")
    assert "150/150" in terminal.getvalue().split("\r")[-1]


def test_no_bar_without_a_label_or_a_terminal(echo, monkeypatch):
    model, src = echo
    terminal = Terminal()  # the dev BLEU inside training: no label, no bar, even on a terminal
    monkeypatch.setattr(sys, "stderr", terminal)
    assert decode(model, src, None) == src and terminal.getvalue() == ""
    log = io.StringIO()  # eval.py writing to a log: labelled, but not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    assert decode(model, src, "translating test (beam 4)") == src and log.getvalue() == ""
