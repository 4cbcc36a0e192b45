"""configs/default.py with --config.model.attention_type=X: validates, builds, and takes two training steps."""

import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from models import Transformer
from tiny import train_config
from training import config as config_lib
from training.core import step as step_lib

VOCAB = 40


def tiny_config(attention_type, options=""):
    return train_config(
        2, **{"model.max_len": 32, "model.attention_type": attention_type, "model.attention_options": options}
    )


def batch(rng=np.random.default_rng(0)):
    src = rng.integers(3, VOCAB, size=(4, 12)).astype(np.int32)
    tgt = rng.integers(3, VOCAB, size=(4, 11)).astype(np.int32)
    src[0, 8:] = tgt[0, 7:] = 0  # padding
    tgt_in = np.concatenate([np.full((4, 1), 2, np.int32), tgt[:, :-1]], axis=1)
    return {
        "src": jnp.asarray(src),
        "tgt_in": jnp.asarray(tgt_in),
        "tgt_out": jnp.asarray(tgt),
        "weights": jnp.asarray(tgt != 0, jnp.float32),
    }


# A train step's compile costs ~15-30 s of CPU per member, and the config -> model -> step path is the
# same for every member: it is run for the two with their own state (performer's decode state) and
# projections (mla); every member's model is tested in tests/models/test_transformer_family.py.
@pytest.mark.slow
@pytest.mark.parametrize("attention_type", ["performer", "mla"])
def test_each_member_trains_two_steps_from_the_default_config(attention_type):
    config = tiny_config(attention_type)
    config_lib.validate(config)
    model_config = config_lib.model_config(config, VOCAB, "float32")
    assert model_config.attention_type == attention_type
    data = batch()
    tx = step_lib.make_optimizer(config.optimizer, config.num_train_steps)
    state = step_lib.create_state(
        Transformer(model_config), tx, jax.random.key(0), SimpleNamespace(src=data["src"], tgt_in=data["tgt_in"])
    )
    train_step = jax.jit(lambda s, b, r: step_lib.train_step(s, b, r, label_smoothing=0.1))
    losses = []
    for _ in range(2):
        state, metrics = train_step(state, data, jax.random.key(1))
        losses.append(float(metrics["loss"]))
    assert all(np.isfinite(losses)) and int(state.step) == 2


def test_options_text_is_parsed_and_checked():
    assert config_lib.parse_options("max_length=32, share_kv=true,alpha_init=1.5") == {
        "max_length": 32,
        "share_kv": True,
        "alpha_init": 1.5,
    }
    with pytest.raises(ValueError, match=re.escape("config.model.attention_options = {'k': 3}: ['k'] not settable")):
        config_lib.validate(tiny_config("performer", "k=3"))
    with pytest.raises(ValueError, match="config.model.attention_type = 'flash'"):
        config_lib.validate(tiny_config("flash"))


def test_old_configs_read_back_as_softmax():
    config = default.get_config()
    del config.model["attention_type"], config.model["attention_options"]
    completed = config_lib.complete(config)
    assert (completed.model.attention_type, completed.model.attention_options) == ("softmax", "")
