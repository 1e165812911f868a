"""DTensor leaves (FSDP2, tensor parallelism): what a snapshot keeps of one, and loading a
restored state into a state dict the caller already has.

A DTensor is saved as its local shard plus its global metadata: global shape, the mesh's shape
(and dimension names), its placements (``Shard(dim)`` or ``Replicate()`` per mesh dimension) and
this rank's coordinate in the mesh and offsets in the global tensor. Placements other than those
two (``Partial``, the strided shards of FSDP2 combined with tensor parallelism) are refused by
name: their local shard is not a plain block of the global tensor.

Restoring gives :class:`SavedShard` leaves: a DTensor needs its device mesh, which only the
caller's process has. :func:`load_into` copies them (and plain tensors) into the caller's
tensors, the way ``load_state_dict`` and DCP's ``load`` do, after checking every leaf.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ray_ckpt.errors import ConfigError, LayoutChangedError

Placement = tuple[str, ...] | tuple[str, int]  # ("S", dim) or ("R",)


@dataclasses.dataclass(frozen=True)
class SavedShard:
    """One rank's shard of a DTensor as saved: ``local`` holds the global tensor's block that
    starts at ``offsets`` (shape ``local.shape``); the rest says how the tensor was laid out."""

    local: torch.Tensor
    global_shape: tuple[int, ...]
    placements: tuple[Placement, ...]
    mesh_shape: tuple[int, ...]
    mesh_dim_names: tuple[str, ...] | None
    coordinate: tuple[int, ...]
    offsets: tuple[int, ...]

    def layout(self) -> dict[str, Any]:
        """Everything but the data, as the snapshot header keeps it."""
        return {
            "shape": list(self.global_shape),
            "placements": [list(p) for p in self.placements],
            "mesh": list(self.mesh_shape),
            "mesh_dims": None if self.mesh_dim_names is None else list(self.mesh_dim_names),
            "coordinate": list(self.coordinate),
            "offsets": list(self.offsets),
        }


@functools.cache
def dtensor_type() -> type | None:
    """torch's DTensor class, or None where torch.distributed lacks it."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def is_dtensor(obj: Any) -> bool:
    kind = dtensor_type()
    return kind is not None and isinstance(obj, kind)


def describe(tensor: Any) -> SavedShard:
    """The shard this rank holds of DTensor ``tensor`` (its local tensor, not copied) with the
    layout. ValueError, saying why, for a placement that is not Shard(dim) or Replicate(), or
    a local shard whose shape is not the block its placements give."""
    from torch.distributed.tensor import Replicate, Shard

    mesh = tensor.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError("this rank is not part of the DTensor's device mesh")
    placements: list[Placement] = []
    for placement in tensor.placements:
        if type(placement) is Shard:
            placements.append(("S", int(placement.dim)))
        elif type(placement) is Replicate:
            placements.append(("R",))
        else:
            raise ValueError(
                f"placement {placement} is not supported (only Shard(dim) and Replicate()): gather the "
                "tensor into one of those, e.g. tensor.redistribute(placements=[Shard(0)])"
            )
    shape = tuple(int(d) for d in tensor.shape)
    local_shape, offsets = block(shape, tuple(mesh.shape), tuple(placements), tuple(coordinate))
    local = tensor.to_local()
    if tuple(local.shape) != local_shape:
        raise ValueError(
            f"its local shard has shape {tuple(local.shape)}, but its placements {tensor.placements} on mesh "
            f"{tuple(mesh.shape)} give {local_shape} (an uneven or padded layout ray_ckpt cannot describe)"
        )
    names = mesh.mesh_dim_names
    return SavedShard(
        local=local,
        global_shape=shape,
        placements=tuple(placements),
        mesh_shape=tuple(int(n) for n in mesh.shape),
        mesh_dim_names=None if names is None else tuple(str(n) for n in names),
        coordinate=tuple(int(c) for c in coordinate),
        offsets=offsets,
    )


def block(
    shape: tuple[int, ...], mesh: tuple[int, ...], placements: tuple[Placement, ...], coordinate: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(local shape, offsets) of the block that mesh ``coordinate`` holds of a global tensor of
    ``shape``: mesh dimensions apply in order, each ``("S", d)`` splitting the current block's
    dimension d as ``torch.chunk`` does (chunks of ceil(size / n), the last ones short or empty)."""
    size, start = list(shape), [0] * len(shape)
    for placement, count, index in zip(placements, mesh, coordinate, strict=True):
        if placement[0] != "S":
            continue
        dim = int(placement[1])
        chunk = -(-size[dim] // count)
        begin = min(index * chunk, size[dim])
        length = max(0, min(chunk, size[dim] - index * chunk))
        start[dim] += begin
        size[dim] = length
    return tuple(size), tuple(start)


def layout_of(node: Mapping[str, Any]) -> dict[str, Any]:
    """Check a saved layout read back from a header; returns the SavedShard fields but
    ``local``. ValueError, saying what is wrong, for anything malformed."""

    def ints(key: str, low: int = 0) -> tuple[int, ...]:
        value = node.get(key)
        if type(value) is not list or any(type(v) is not int or v < low for v in value):
            raise ValueError(f"{key!r} must be a list of ints >= {low}, got {value!r:.100}")
        return tuple(value)

    shape, mesh, coordinate, offsets = ints("shape"), ints("mesh", 1), ints("coordinate"), ints("offsets")
    raw = node.get("placements")
    if type(raw) is not list or len(raw) != len(mesh):
        raise ValueError(f"'placements' must list one placement per mesh dimension, got {raw!r:.100}")
    placements: list[Placement] = []
    for p in raw:
        if p == ["R"]:
            placements.append(("R",))
        elif type(p) is list and len(p) == 2 and p[0] == "S" and type(p[1]) is int and 0 <= p[1] < len(shape):
            placements.append(("S", p[1]))
        else:
            raise ValueError(f"placement {p!r:.50} is neither ['R'] nor ['S', dim]")
    names = node.get("mesh_dims")
    if names is not None and (
        type(names) is not list or len(names) != len(mesh) or any(type(n) is not str for n in names)
    ):
        raise ValueError(f"'mesh_dims' must be None or one name per mesh dimension, got {names!r:.100}")
    if len(coordinate) != len(mesh) or any(c >= n for c, n in zip(coordinate, mesh, strict=True)):
        raise ValueError(f"coordinate {coordinate} is not in mesh {mesh}")
    if len(offsets) != len(shape):
        raise ValueError(f"offsets {offsets} do not match shape {shape}")
    return {
        "global_shape": shape,
        "placements": tuple(placements),
        "mesh_shape": mesh,
        "mesh_dim_names": None if names is None else tuple(names),
        "coordinate": coordinate,
        "offsets": offsets,
    }


def walk(saved: Any, target: Any, leaf: Callable[[Any, Any, tuple[Any, ...]], Any], keys: tuple[Any, ...] = ()) -> Any:
    """``saved`` rebuilt container by container (dicts keep their type), every other node
    replaced by ``leaf(node, target's node at the same place or None, its keys)``."""
    if isinstance(saved, dict):
        children = target if isinstance(target, Mapping) else {}
        merged = type(saved)()
        for key, value in saved.items():
            merged[key] = walk(value, children.get(key), leaf, (*keys, key))
        return merged
    if isinstance(saved, (list, tuple)):
        items = target if isinstance(target, (list, tuple)) and len(target) == len(saved) else [None] * len(saved)
        values = [walk(v, t, leaf, (*keys, i)) for i, (v, t) in enumerate(zip(saved, items, strict=True))]
        return values if isinstance(saved, list) else tuple(values)
    return leaf(saved, target, keys)


def key_path(keys: tuple[Any, ...]) -> str:
    """``keys`` as a Python subscript of the state: ``state['optim']['state'][3]``."""
    return "state" + "".join(f"[{key!r}]" for key in keys)


def holds_shards(state: Any) -> list[str]:
    """Key paths (as ``state[...]`` subscripts) of the SavedShard leaves in a restored state."""
    found: list[str] = []
    walk(state, None, lambda node, _, keys: found.append(key_path(keys)) if isinstance(node, SavedShard) else None)
    return found


def load_into(saved: Any, into: Any) -> Any:
    """Copy the restored state ``saved`` into the caller's state ``into`` (same tree; a
    ``model.state_dict()``, or DCP's ``get_state_dict(model, optimizer)`` pair in a dict).

    Every tensor of ``saved`` whose place in ``into`` holds a tensor is copied into it (same
    shape and dtype required, any device); every SavedShard into the DTensor there, which must
    have the same global shape, dtype, mesh shape, placements and this rank's block. Other
    values, and tensors ``into`` has no place for, come from ``saved``. Returns the merged tree
    (``into``'s tensors, filled). Everything is checked before anything is copied: a mismatch
    raises ConfigError naming the key (LayoutChangedError when only the sharding differs) and
    leaves ``into`` untouched."""
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    merged = walk(saved, into, lambda node, target, keys: _merge(node, target, keys, copies))
    with torch.no_grad():
        for target, source in copies:
            target.copy_(source)
    return merged


def target_layout(target: Any, path: str) -> SavedShard:
    """The layout of the DTensor that ``into`` holds at ``path`` (its local shard not copied);
    ConfigError when there is none or ray_ckpt cannot describe it."""
    if not is_dtensor(target):
        raise ConfigError(
            f"{path} was saved as a DTensor, but `into` holds {type(target).__name__} there: pass the "
            "state dict of the model and optimizer as they are now (e.g. get_state_dict(model, optimizer), "
            "which also creates the optimizer's state)",
            key_path=path,
        )
    try:
        return describe(target)
    except ValueError as error:
        raise ConfigError(f"{path}: `into` holds a DTensor ray_ckpt cannot load into: {error}", key_path=path) from None


def plain_target(shape: tuple[int, ...], dtype: torch.dtype, target: Any, path: str) -> torch.Tensor | None:
    """The plain tensor ``into`` holds at ``path`` for a saved tensor of ``shape`` and
    ``dtype``, or None when it holds no tensor there; ConfigError for a DTensor or a tensor of
    another shape or dtype."""
    if is_dtensor(target):
        raise ConfigError(f"{path} was saved as a plain tensor, but `into` holds a DTensor there", key_path=path)
    if not isinstance(target, torch.Tensor):
        return None
    if tuple(target.shape) != tuple(shape) or target.dtype != dtype:
        raise ConfigError(
            f"{path}: saved {dtype} {tuple(shape)}, `into` holds {target.dtype} {tuple(target.shape)}", key_path=path
        )
    return target


def _merge(saved: Any, target: Any, keys: tuple[Any, ...], copies: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    path = key_path(keys)
    if isinstance(saved, SavedShard):
        _check_same_block(saved, target_layout(target, path), path)
        copies.append((target.to_local(), saved.local))
        return target
    if isinstance(saved, torch.Tensor):
        plain = plain_target(tuple(saved.shape), saved.dtype, target, path)
        if plain is None:
            return saved
        copies.append((plain, saved))
        return plain
    return saved


def _check_same_block(saved: SavedShard, now: SavedShard, path: str) -> None:
    if (saved.global_shape, saved.local.dtype) != (now.global_shape, now.local.dtype):
        raise ConfigError(
            f"{path}: saved {saved.local.dtype} of global shape {saved.global_shape}, `into` holds "
            f"{now.local.dtype} of global shape {now.global_shape}",
            key_path=path,
        )
    differences = [
        f"{what} {a} saved, {b} now"
        for what, a, b in (
            ("mesh", saved.mesh_shape, now.mesh_shape),
            ("placements", saved.placements, now.placements),
            ("block offsets", saved.offsets, now.offsets),
            ("block shape", tuple(saved.local.shape), tuple(now.local.shape)),
        )
        if a != b
    ]
    if differences:
        raise LayoutChangedError(
            f"{path}: this rank's shard was saved in another layout ({'; '.join(differences)}); a restore "
            "from peer memory reshards it, a backup restores only into the layout it was saved in",
            key_path=path,
        )
