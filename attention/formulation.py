"""Deprecated: `attention.formulation` became part of `attention.head` (the one-head formula and its products).

Each name still resolves, with a `DeprecationWarning` naming its new home; `attention.Formulation` is unchanged.
"""

from attention.deprecated import moved

_NAMES = ("Formulation", "PLAIN", "is_nvidia_gpu", "logits_dtype", "products", "resolve", "target")
__getattr__ = moved("attention.formulation", dict.fromkeys(_NAMES, "attention.head"))
