"""A Linen layer's decode, fed in chunks: the helper behind the family's "decode equals the full pass" tests."""

import jax.numpy as jnp


def decode_in_chunks(layer, variables, x, bounds):
    """The outputs of `layer` (decode=True) fed x[:, lo:hi] for each (lo, hi) in `bounds`, concatenated
    along the length axis, from `variables`' empty cache."""
    cache, pieces = variables["cache"], []
    for lo, hi in bounds:
        out, updated = layer.apply({"params": variables["params"], "cache": cache}, x[:, lo:hi], mutable=["cache"])
        cache = updated["cache"]
        pieces.append(out)
    return jnp.concatenate(pieces, axis=1)
