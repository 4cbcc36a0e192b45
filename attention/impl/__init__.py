"""The attention implementations: one file each, one signature (`attention.grouped`), one table.

`IMPLEMENTATIONS` is the only place that knows the choices; `attention.IMPLS` (plus "auto")
and the validation of `impl` derive from it.
"""

from collections.abc import Callable

import jax

from attention.impl import blockwise, einsum, jax_nn, vmap

# (q, k, v, mask, bias, options) -> (out, weights or None), as `attention.grouped` calls them
IMPLEMENTATIONS: dict[str, Callable[..., tuple[jax.Array, jax.Array | None]]] = {
    "vmap": vmap.attention,
    "einsum": einsum.attention,
    "xla": jax_nn.xla,
    "cudnn": jax_nn.cudnn,
    "blockwise": blockwise.attention,
}
