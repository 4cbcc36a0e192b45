"""HeadGeometry: defaults and the errors that name the field."""

import pytest

from attention.geometry import HeadGeometry


def test_defaults_split_the_features_evenly():
    g = HeadGeometry.resolve(8, features=512)
    assert (g.num_heads, g.num_kv_heads, g.head_dim, g.v_head_dim) == (8, 8, 64, 64)
    assert (g.group_size, g.kv_sharing, g.qkv_features, g.kv_cache_elements) == (1, "MHA", 512, 8 * 128)


@pytest.mark.parametrize("kv, sharing, group", [(8, "MHA", 1), (2, "GQA", 4), (1, "MQA", 8)])
def test_kv_sharing(kv, sharing, group):
    g = HeadGeometry.resolve(8, num_kv_heads=kv, head_dim=16, v_head_dim=32)
    assert (g.kv_sharing, g.group_size, g.kv_cache_elements) == (sharing, group, kv * 48)


def test_single_head_is_mha():
    assert HeadGeometry.resolve(1, features=4).kv_sharing == "MHA"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=0, features=8), "M.num_heads = 0; expected a positive int"),
        (dict(num_heads=8, num_kv_heads=3, features=64), "M.num_kv_heads = 3; expected a divisor of num_heads (8)"),
        (dict(num_heads=8, features=60), "M.d_model = 60; expected divisible by num_heads (8)"),
        (dict(num_heads=8), "M.d_model = None; expected a positive int"),
        (dict(num_heads=8, head_dim=0), "M.head_dim = 0; expected None or a positive int"),
        (dict(num_heads=8, head_dim=8, v_head_dim=True), "M.v_head_dim = True; expected None or a positive int"),
    ],
)
def test_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HeadGeometry.resolve(**kwargs, features_name="d_model", owner="M.")
