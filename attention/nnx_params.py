"""The NNX layer's parameters as a Linen `params` tree, and back.

Flax's Linen and NNX attention layers and ours share parameter names and shapes, so a tree from one
loads into the others (`attention.nnx.to_linen_params`, `attention.nnx.load_linen_params`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx, traverse_util


def to_linen_params(layer: nnx.Module) -> dict:
    """The layer's `nnx.Param`s as a Linen `params` tree (`{"query": {"kernel": ...}, ...}`).

    Flax's Linen and NNX attention layers and ours share parameter names and shapes, so this
    tree is what `attention.MultiHeadAttention` / `flax.linen.MultiHeadDotProductAttention`
    take as `{"params": tree}` for the same configuration.
    """
    return nnx.to_pure_dict(nnx.state(layer, nnx.Param))


def load_linen_params(layer: nnx.Module, params: Mapping[str, Any]) -> None:
    """Set `layer`'s `nnx.Param`s from a Linen `params` tree (the `"params"` collection, not the variables).

    Raises a ValueError naming the first parameter path that is missing, unexpected or of
    another shape.
    """
    state = nnx.state(layer, nnx.Param)
    ours = traverse_util.flatten_dict(nnx.to_pure_dict(state))
    theirs = traverse_util.flatten_dict(dict(params))
    for path in sorted(set(ours) | set(theirs)):
        name = "/".join(path)
        if path not in theirs:
            raise ValueError(f"params: {name} is missing (the layer has it, shape {ours[path].shape})")
        if path not in ours:
            raise ValueError(f"params: {name} is not a parameter of this layer ({type(layer).__name__})")
        if tuple(jnp.shape(theirs[path])) != tuple(ours[path].shape):
            raise ValueError(
                f"params: {name} has shape {tuple(jnp.shape(theirs[path]))}; "
                f"the layer expects {tuple(ours[path].shape)}"
            )
    nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict({p: jnp.asarray(v) for p, v in theirs.items()}))
    nnx.update(layer, state)
