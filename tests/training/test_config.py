"""config.model -> models.TransformerConfig: read by field name, old workdirs' config.json files still load, typos
refused."""

import dataclasses
import json
import re
from pathlib import Path

import jax.numpy as jnp
import ml_collections
import pytest

from configs import default
from models import TransformerConfig
from training import config as config_lib

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 300
HOOKS = dict(dot_general=None, formulation=None, dropout_keep=None)  # the backend's choices, not the config's


def committed_workdir_configs() -> list[Path]:
    """The config.json of every workdir kept in results/ (the oldest written before most later fields)."""
    return sorted((ROOT / "results").rglob("config.json"))


def test_config_model_is_the_model_fields_and_the_run_settings():
    # configs/default.py gives every model field its default, and holds nothing else but the run's settings
    assert set(default.get_config().model) == set(config_lib.model_field_names()) | set(config_lib.RUN_SETTINGS)
    # every TransformerConfig field is either read from config.model or set by the run, none both
    fields = [f.name for f in dataclasses.fields(TransformerConfig)]
    assert sorted(config_lib.model_field_names() + config_lib.SET_BY_RUN) == sorted(fields)


def test_the_default_config_gives_the_model_written_out_by_hand():
    config = default.get_config()
    config.model.update(
        dtype="float32", num_kv_heads=2, v_head_dim=32, attention_type="performer", attention_options="num_features=16"
    )
    expected = TransformerConfig(
        vocab_size=VOCAB,
        d_model=256,
        num_heads=4,
        num_kv_heads=2,
        head_dim=None,
        v_head_dim=32,
        num_layers=3,
        mlp_dim=1024,
        dropout_rate=0.1,
        attention_dropout_rate=0.0,
        pre_ln=True,
        activation="relu",
        tie_embeddings=True,
        scale_out_init=False,
        max_len=256,
        dtype=jnp.float32,
        attention_impl="vmap",
        attention_type="performer",
        attention_options={"num_features": 16},
    )
    assert dataclasses.replace(config_lib.model_config(config, VOCAB, "float32"), **HOOKS) == expected


@pytest.mark.parametrize("path", committed_workdir_configs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_workdir_config_loads_validates_and_builds(path):
    config = config_lib.load_saved(path)
    config_lib.validate(config)
    model = config_lib.model_config(config, VOCAB, "float32")
    saved = json.loads(path.read_text())["model"]
    for name, value in saved.items():  # what the workdir saved reaches the model
        if name not in config_lib.RUN_SETTINGS:
            expected = config_lib.parse_options(value) if name == "attention_options" else value
            assert getattr(model, name) == expected, name


def test_the_oldest_workdir_config_reads_back_with_the_later_fields_at_their_old_behaviour():
    path = ROOT / "results/default/config.json"
    saved = json.loads(path.read_text())
    assert not {"v_head_dim", "matmul", "attention_type", "attention_options"} & set(saved["model"])  # it predates them
    config = config_lib.load_saved(path)
    assert (
        config.model.v_head_dim,
        config.model.matmul,
        config.model.attention_type,
        config.model.attention_options,
    ) == (None, "auto", "softmax", "")
    assert (config.data.pack_length, config.optimizer.schedule, config.eval.lengths) == (0, "rsqrt", ())
    expected = TransformerConfig(vocab_size=VOCAB, d_model=256, num_heads=4, num_layers=3, mlp_dim=1024, max_len=256)
    assert dataclasses.replace(config_lib.model_config(config, VOCAB, "float32"), **HOOKS) == expected


@pytest.mark.parametrize("where", ["config file", "config.json"])
def test_an_unknown_model_field_is_refused_by_name(where, tmp_path):
    config = default.get_config()
    config.model.num_head = 8  # a typo of num_heads
    if where == "config.json":
        (tmp_path / "config.json").write_text(config.to_json_best_effort())
        config = config_lib.load_saved(tmp_path / "config.json")
    with pytest.raises(ValueError, match=re.escape("config.model.num_head = 8: no such model field; expected one of")):
        config_lib.validate(config)
    with pytest.raises(ValueError, match="config.model.num_head = 8"):
        config_lib.model_config(config, VOCAB, "float32")


@dataclasses.dataclass(frozen=True)
class ConfigWithANewField(TransformerConfig):
    new_knob: int = 0  # 0: the behaviour before the field


def test_a_new_model_field_is_one_dataclass_field_and_its_default(monkeypatch):
    monkeypatch.setattr(config_lib, "TransformerConfig", ConfigWithANewField)
    config = default.get_config()
    config.model.new_knob = 3  # its default in configs/default.py
    config.model.dtype = "float32"
    assert config_lib.model_config(config, VOCAB).new_knob == 3
    old = ml_collections.ConfigDict(json.loads(default.get_config().to_json_best_effort()))  # saved before the field
    assert config_lib.complete(old).model.new_knob == 0
    assert config_lib.model_config(old, VOCAB, "float32").new_knob == 0


def test_options_are_written_as_the_text_they_are_read_from():
    options = {"num_features": 16, "share_kv": True, "alpha_init": 1.5, "kernel": "relu", "seed": None}
    assert config_lib.parse_options(config_lib.format_options(options)) == options
    assert config_lib.format_options({}) == ""


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("seed", -1, "config.seed = -1; expected an int in [0, 2**32)"),  # was SentencePiece's TypeError
        (
            "data.bucket_lengths",
            ("(64",),
            "config.data.bucket_lengths = ('(64',); expected a tuple of ints >= 2",
        ),  # '--config.data.bucket_lengths=(64'
        ("data.eval_split", "bogus", "config.data.eval_split = 'bogus'; expected one of Multi30k's splits"),
        ("data.train_split", "tain", "config.data.train_split = 'tain'; expected one of Multi30k's splits"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(field, value, named):
    config = default.get_config()
    section, _, name = field.rpartition(".")
    (config[section] if section else config)[name] = value
    with pytest.raises(ValueError, match=re.escape(named)):
        config_lib.validate(config)


@pytest.mark.parametrize(
    "arg, named",
    [
        ("h=abc", "configs/default.py:h=abc: h (model.num_heads) = 'abc'; expected a positive int"),
        ("kv=0", "configs/default.py:kv=0: kv (model.num_kv_heads) = '0'; expected a positive int"),
        ("foo=1", "configs/default.py:foo=1: unknown argument 'foo'"),
        ("h8", "configs/default.py:h8: expected key=value pairs"),
    ],
)
def test_a_bad_config_argument_names_itself(arg, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        default.get_config(arg)


def test_the_config_holds_no_field_nothing_reads():
    assert "beam_size" not in default.get_config().eval  # eval.py's --beam_size decides the beam


def test_the_wmt_configs_take_the_head_count_argument():
    """configs/base.py and big.py set their own heads, then the argument's: `base.py:h=16` trains 16 heads (the
    paper-scale rows A sweep, configs/table3_base.py, varies nothing else)."""
    from configs import base, big, table3_base

    assert (base.get_config().model.num_heads, big.get_config().model.num_heads) == (8, 16)
    assert (base.get_config("h=16,kv=2").model.num_heads, base.get_config("h=16,kv=2").model.num_kv_heads) == (16, 2)
    assert big.get_config("h=4").model.num_heads == 4
    points = [table3_base.get_config(f"h={h}") for h in table3_base.SWEEP_VALUES]
    assert [c.model.num_heads for c in points] == [1, 4, 8, 16, 32]
    assert {(c.model.d_model, c.data.dataset, c.data.eval_split) for c in points} == {
        (512, "wmt14_translate/de-en", "validation")
    }
