"""The attention implementations: one file each, one signature (`attention.core`), one table.

`IMPLEMENTATIONS` is the only place that knows the choices and the K/V layout each computes in;
`attention.IMPLS` (plus "auto") and the validation of `impl` derive from it.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax

from attention import head
from attention.impl import blockwise, einsum, jax_nn


class Implementation(NamedTuple):
    # (q, k, v, mask, bias, options) -> (out, weights or None), as `attention.core` describes them
    attention: Callable[..., tuple[jax.Array, jax.Array | None]]
    kv_layout: str  # the layout it takes k and v in (`attention.core.KV_LAYOUTS`)


IMPLEMENTATIONS: dict[str, Implementation] = {
    "vmap": Implementation(head.vmapped, "BNTH"),  # the one-head formula, vmapped
    "einsum": Implementation(einsum.attention, "BNTH"),
    "xla": Implementation(jax_nn.xla, "BTNH"),  # jax.nn.dot_product_attention's layout
    "cudnn": Implementation(jax_nn.cudnn, "BTNH"),
    "blockwise": Implementation(blockwise.attention, "BNTH"),
}
