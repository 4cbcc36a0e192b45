"""The device mesh and the named sharding rules: batch over `data`; heads and MLP hidden units over `model`.

Megatron-style tensor parallelism: the q/k/v projections are split by output head and W^O by
input head, so each `model` shard computes whole heads and one all-reduce after W^O sums them;
the MLP's first layer is split by hidden unit (columns), its second by rows. Embeddings (and an
untied output layer) are split over the vocabulary when `mesh.shard_embeddings`, else replicated.
K/V projections of GQA/MQA split only when the KV heads divide evenly over `model`; otherwise they
are replicated (every shard computes the few KV heads it shares). LayerNorms and output biases are
replicated. The same rules apply to the optimizer's moments, which mirror the parameter tree.
"""

from __future__ import annotations

import re

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

DATA, MODEL = "data", "model"

# (path pattern, axis split over `model`, may fall back to replicated); paths are '/'-joined keys.
_RULES = (
    (r"attention/query/kernel$", 1, None),  # [D, H, Dk]
    (r"attention/query/bias$", 0, None),  # [H, Dk]
    (r"attention/(key|value)/kernel$", 1, "kv"),  # [D, G, Dk]
    (r"attention/(key|value)/bias$", 0, "kv"),  # [G, Dk]
    (r"attention/out/kernel$", 0, None),  # [H, Dk, D]
    (r"mlp/wi/kernel$", 1, None),  # [D, mlp]
    (r"mlp/wi/bias$", 0, None),  # [mlp]
    (r"mlp/wo/kernel$", 0, None),  # [mlp, D]
)
_EMBEDDING_RULES = (
    (r"(^|/)embed/embedding$", 0, None),  # [vocab, D]
    (r"(^|/)logits/kernel$", 1, None),  # [D, vocab]
    (r"(^|/)logits/bias$", 0, None),  # [vocab]
)


def mesh_shape(data: int, model: int, num_devices: int) -> tuple[int, int]:
    """(data, model) with -1 resolved to the rest of the devices; ValueError unless the product is `num_devices`."""
    for name, value in (("data", data), ("model", model)):
        if not isinstance(value, int) or (value < 1 and value != -1):
            raise ValueError(f"config.mesh.{name} = {value!r}; expected a positive int or -1 (the rest of the devices)")
    if data == -1 and model == -1:
        raise ValueError("config.mesh.data and config.mesh.model are both -1; at most one may be 'the rest'")
    if data == -1 or model == -1:
        known = model if data == -1 else data
        if num_devices % known:
            raise ValueError(f"config.mesh: {num_devices} devices do not split into shards of {known}")
        data, model = (num_devices // known, model) if data == -1 else (data, num_devices // known)
    if data * model != num_devices:
        raise ValueError(
            f"config.mesh.data * config.mesh.model = {data} * {model} = {data * model}; expected the number "
            f"of devices, {num_devices} (set one of them to -1 for 'the rest')"
        )
    return data, model


def make_mesh(data: int, model: int, devices=None) -> Mesh:
    """A (data, model) mesh over `devices` (default: all devices of all processes)."""
    devices = list(devices if devices is not None else jax.devices())
    shape = mesh_shape(data, model, len(devices))
    return jax.make_mesh(shape, (DATA, MODEL), axis_types=(AxisType.Auto, AxisType.Auto), devices=devices)


def check_model_shards(model_shards: int, num_heads: int, mlp_dim: int) -> None:
    """ValueError unless the query heads and the MLP hidden units split evenly over `model_shards`."""
    if model_shards > num_heads:
        raise ValueError(
            f"config.mesh.model = {model_shards}; expected at most config.model.num_heads ({num_heads}): "
            "heads are the unit split over the model axis"
        )
    if num_heads % model_shards:
        raise ValueError(
            f"config.mesh.model = {model_shards}; expected a divisor of config.model.num_heads ({num_heads})"
        )
    if mlp_dim % model_shards:
        raise ValueError(f"config.mesh.model = {model_shards}; expected a divisor of config.model.mlp_dim ({mlp_dim})")


def path_name(path) -> str:
    """A key path as 'a/b/c' (dict keys, attribute names and sequence indices)."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
    return "/".join(parts)


def param_spec(name: str, shape: tuple[int, ...], model_shards: int, shard_embeddings: bool) -> P:
    """The PartitionSpec of one parameter (or optimizer moment) named `name` ('a/b/kernel')."""
    rules = _RULES + (_EMBEDDING_RULES if shard_embeddings else ())
    for pattern, axis, fallback in rules:
        if re.search(pattern, name) and len(shape) > axis:
            if shape[axis] % model_shards:
                if fallback == "kv":
                    return P()
                raise ValueError(
                    f"parameter {name} {shape}: axis {axis} ({shape[axis]}) does not split over "
                    f"mesh.model = {model_shards}"
                    + (
                        "; set config.mesh.shard_embeddings=False"
                        if (pattern, axis, fallback) in _EMBEDDING_RULES
                        else ""
                    )
                )
            return P(*(MODEL if i == axis else None for i in range(len(shape))))
    return P()


def state_shardings(abstract_state, mesh: Mesh, shard_embeddings: bool):
    """NamedShardings for every leaf of a (shape-only) train state, by `param_spec`."""
    model_shards = mesh.shape[MODEL]

    def sharding(path, leaf):
        shape = tuple(getattr(leaf, "shape", ()))
        return NamedSharding(mesh, param_spec(path_name(path), shape, model_shards, shard_embeddings))

    return jax.tree_util.tree_map_with_path(sharding, abstract_state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows over `data`, replicated over `model`."""
    return NamedSharding(mesh, P(DATA))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def pad_rows(array: np.ndarray, multiple: int) -> np.ndarray:
    """Append zero rows (PAD_ID is 0, and so is the weight) so that the row count divides by `multiple`."""
    extra = -array.shape[0] % multiple
    return np.concatenate([array, np.zeros((extra, *array.shape[1:]), array.dtype)]) if extra else array


def put_batch(batch: dict, mesh: Mesh) -> dict:
    """Global [rows, L] host arrays -> jax Arrays split over `data`; each process copies only its own rows.

    Rows are padded with empty rows (weight 0) to a multiple of the data shards, which changes
    neither the loss nor the gradients (both are sums over weighted tokens / token count).
    """
    sharding = batch_sharding(mesh)

    def put(array):
        array = pad_rows(np.asarray(array), mesh.shape[DATA])
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    return {name: put(array) for name, array in batch.items()}


def padded_rows(rows: int, mesh: Mesh) -> int:
    """A batch's row count padded to a multiple of the data shards (`pad_rows`)."""
    return rows + (-rows % mesh.shape[DATA])


def local_rows(mesh: Mesh, rows: int) -> tuple[int, int]:
    """[start, stop) of the rows this process's devices hold of a batch of `rows` (padded, `padded_rows`): the only
    rows it assembles. ValueError where they are not one contiguous range (a mesh that interleaves the processes'
    devices along `data`)."""
    padded = padded_rows(rows, mesh)
    if jax.process_count() == 1:
        return 0, padded
    spans = {
        (index[0].start or 0, padded if index[0].stop is None else index[0].stop)
        for index in batch_sharding(mesh).addressable_devices_indices_map((padded, 1)).values()
    }
    start, stop = min(a for a, _ in spans), max(b for _, b in spans)
    if sum(b - a for a, b in spans) != stop - start:
        raise ValueError(
            f"this process's devices hold rows {sorted(spans)} of the batch, not one range: order the mesh's devices "
            "so that each process's devices are adjacent along 'data' (jax.make_mesh does)"
        )
    return start, stop


def put_local_batch(batch: dict, mesh: Mesh, rows: int) -> dict:
    """This process's rows (`local_rows`) of a batch of `rows` -> global jax Arrays split over `data`."""
    sharding = batch_sharding(mesh)
    padded = padded_rows(rows, mesh)
    return {
        name: jax.make_array_from_process_local_data(sharding, np.asarray(a), (padded, *np.shape(a)[1:]))
        for name, a in batch.items()
    }


def describe(kv_heads: int, mesh: Mesh) -> str:
    """The start-up line: the mesh and how K/V heads are placed on it."""
    model_shards = mesh.shape[MODEL]
    kv_split = kv_heads % model_shards == 0
    return (
        f"mesh {dict(mesh.shape)} over {mesh.devices.size} devices ({jax.process_count()} processes); "
        f"K/V heads: {kv_heads} over model={model_shards}: "
        + ("sharded" if kv_split else f"replicated ({kv_heads} is not a multiple of {model_shards})")
    )


def describe_params(abstract_params, shardings) -> list[str]:
    """Every parameter's shape and spec, one line each (logged with --verbose)."""
    specs = jax.tree_util.tree_leaves_with_path(shardings)
    return [
        f"  {path_name(path)} {tuple(leaf.shape)} {sharding.spec}"
        for (path, leaf), (_, sharding) in zip(jax.tree_util.tree_leaves_with_path(abstract_params), specs)
    ]
