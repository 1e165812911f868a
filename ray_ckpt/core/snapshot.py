"""The no-pickle snapshot format: a nested training state <-> (msgpack header, one byte payload).

A *state* is a tree of dicts (``dict`` or ``collections.OrderedDict``, keys ``str`` or ``int``
in [-2**63, 2**64)), lists and tuples whose leaves are torch tensors, numpy arrays and scalars
(fixed-size dtypes, below) or plain values (``None``, ``bool``, ``int`` of any size, ``float``,
``str``, ``bytes``). Exact container and leaf types are required so that everything comes back
as it went in: a tuple subclass (named tuple), another dict subclass, a set or any other object
is refused with :class:`UnsupportedLeafError` naming its key path, its type and what to convert
it to. RNG states (``random.getstate()``, ``np.random.get_state()``, a numpy bit generator's
``state``, ``torch.get_rng_state()``) and data loader or LR scheduler state dicts are such trees.

Key paths are Python subscripts from the root, named ``state``: ``state['optim']['state'][3]
['exp_avg']`` (dict keys as ``repr``, list and tuple positions as ints).

The header is msgpack (``use_bin_type=True``)::

    {"magic": MAGIC, "version": FORMAT_VERSION, "payload_size": int,
     "tensors": [[dtype name, shape, offset, nbytes], ...],   # payload order
     "tree": node}

with each node a ``[tag, body]`` pair: ``["d", [[key, node], ...]]`` (dict, insertion order),
``["o", ...]`` (OrderedDict), ``["l", [node, ...]]`` (list), ``["t", [node, ...]]`` (tuple),
``["T", tensor index]``, ``["v", plain value]`` and, from version 2, ``["D", {"local": tensor
index, "shape", "placements", "mesh", "mesh_dims", "coordinate", "offsets"}]`` for a DTensor:
this rank's local shard plus its global layout (see :mod:`ray_ckpt.core.dtensor`; restored as a
:class:`~ray_ckpt.core.dtensor.SavedShard`). Version 3 adds three value nodes, kept in the header:
``["I", bytes]`` an int outside [-2**63, 2**64) (two's complement, little-endian, as few bytes as
hold it: a numpy PCG64 state holds 128-bit ints), ``["A", [dtype, shape, bytes]]`` a numpy array
and ``["S", [dtype, bytes]]`` a numpy scalar (``dtype`` is numpy's ``dtype.str``, byte order
included, e.g. ``"<u4"``; ``bytes`` its values in C order). Each header is written with the
lowest version that holds its state: 1 without DTensors and version-3 nodes (what ray_ckpt
before DTensor support reads), 2 with DTensors only, else 3; every version up to 3 is read, and a
reader that knows fewer versions refuses a newer header with a message that says to upgrade.

Numpy arrays of kinds bool, int, uint, float, complex, datetime, timedelta, bytes (``S``) and
str (``U``), of at most :data:`MAX_ARRAY_BYTES` each, are copied into the header when the layout
is built and come back as new, writable arrays of the same dtype and shape (one array found
twice comes back as two). Numpy scalars of those kinds but bytes and str come back as the same
numpy type. Object, structured and void arrays, larger arrays (``torch.from_numpy`` makes them a
tensor, which comes back as a tensor), numpy ``str_``/``bytes_`` scalars and array subclasses are
refused.

Tensor bytes lie in the payload at offsets that are multiples of :data:`ALIGNMENT`; gaps
between them are zero, so the same state always gives the same header and payload bytes (empty
tensors get offset 0). Only tensor data is kept: ``requires_grad`` is dropped and Parameters
come back as plain tensors, always on the CPU. A tensor object that appears several times in the
state is stored once and restored as one shared tensor. Views are not: tensors that share
storage but are distinct objects (``a`` and ``a[10:20]``, ``w`` and ``w.t()``, or the tied
weights of a ``state_dict()``, which detaches each name on its own) are each stored with their
own bytes and restored as independent tensors with the right values, no longer sharing storage
(restore ``into`` the live tensors, or ``load_state_dict``, to fill shared storage again).
Nothing is ever pickled.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import math
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import torch

from ray_ckpt import settings
from ray_ckpt.core import dtensor, hostmem, workpool
from ray_ckpt.errors import SnapshotFormatError, UnsupportedLeafError

MAGIC = "ray_ckpt.core.snapshot"
FORMAT_VERSION = 3  # the newest version written; each header gets the lowest that holds its state
READ_VERSIONS = (1, 2, 3)
ALIGNMENT = 64  # byte alignment of every tensor inside the payload
MAX_DEPTH = 100  # containers nested deeper than this are refused (also stops reference cycles)
MAX_DIMS = 64
OWN_MEMORY_BYTES = 64 << 10  # restore(copy=False) copies tensors up to this size out of the payload
MAX_ARRAY_BYTES = 1 << 20  # the largest numpy array kept (in the header); larger ones: torch.from_numpy

_DTYPE_CANDIDATES = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex32",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
)
DTYPES: Mapping[str, torch.dtype] = types.MappingProxyType(
    {name: getattr(torch, name) for name in _DTYPE_CANDIDATES if isinstance(getattr(torch, name, None), torch.dtype)}
)
"""The tensor dtypes a snapshot can hold, by the name written in the header (those of
``_DTYPE_CANDIDATES`` that this torch build has). Quantized and sub-byte dtypes are refused."""

_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}
_PLAIN_TYPES = (type(None), bool, int, float, str, bytes)
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_ARRAY_KINDS = "biufcmMSU"  # numpy dtype kinds an array may have
_SCALAR_KINDS = "biufcmM"  # and a numpy scalar (np.str_ / np.bytes_ would lose trailing NULs)
_SUPPORTED = (
    "supported: dicts, lists, tuples, torch tensors, numpy arrays and scalars, plain values; "
    "every type and dtype: docs/operations.md#what-a-checkpoint-state-may-hold"
)

State = Any
_Path = tuple[Any, ...]  # (parent path, key) linked pairs; () is the root


@dataclass(frozen=True, eq=False)
class SnapshotLayout:
    """The result of :func:`build_layout`: everything needed to write the payload, nothing copied yet.

    ``tensors[i]`` (detached references to the state's tensors, on any device) go to payload
    bytes ``offsets[i] : offsets[i] + tensors[i].nbytes``. The payload is ``payload_size``
    bytes long. Tensors must keep their shape and dtype until :func:`write_payload` ran; their
    values are read at that time.
    """

    header: bytes
    payload_size: int
    tensors: list[torch.Tensor]
    offsets: list[int]


# ---- state -> header + payload ----------------------------------------------------------------


def build_layout(state: State) -> SnapshotLayout:
    """Walk ``state``, validate every container, key and leaf, lay the tensors out and build the
    header. Touches no tensor data (device tensors are not synchronised). Raises
    UnsupportedLeafError (``details``: ``key_path``, ``leaf_type``) for anything not supported:
    other types, dict keys that are not str/int, sparse, quantized, meta or subclassed tensors."""
    with _gc_paused():
        return _build_layout(state)


def _build_layout(state: State) -> SnapshotLayout:
    walker = _TreeEncoder()
    tree = walker.encode(state, (), 0)
    offsets: list[int] = []
    specs: list[list[Any]] = []
    cursor = 0
    for tensor in walker.tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes:
            offset = -(-cursor // ALIGNMENT) * ALIGNMENT
            cursor = offset + nbytes
        else:
            offset = 0
        offsets.append(offset)
        specs.append([_NAMES[tensor.dtype], list(tensor.shape), offset, nbytes])
    header = msgpack.packb(
        {
            "magic": MAGIC,
            "version": walker.version,
            "payload_size": cursor,
            "tensors": specs,
            "tree": tree,
        },
        use_bin_type=True,
    )
    return SnapshotLayout(header=header, payload_size=cursor, tensors=walker.tensors, offsets=offsets)


def write_payload(layout: SnapshotLayout, out: Any) -> None:
    """Copy every tensor of ``layout`` into ``out`` at its offset and zero the gaps, so bytes
    ``[0, layout.payload_size)`` of ``out`` become the payload; bytes past it are left alone.

    ``out``: a writable C-contiguous numpy array, CPU torch tensor or writable buffer of at least
    ``payload_size`` bytes (any element type; its bytes are used). Non-contiguous and device
    tensors are copied straight into ``out`` (device -> host) without an intermediate copy.
    """
    buf = _writable_bytes(out)
    pinned = buf.is_pinned()
    if buf.numel() < layout.payload_size:
        raise ValueError(f"out holds {buf.numel()} bytes, the payload needs {layout.payload_size}")
    end = 0
    on_cpu: list[tuple[torch.Tensor, int, int]] = []
    for tensor, offset in zip(layout.tensors, layout.offsets):
        nbytes = tensor.numel() * tensor.element_size()
        if not nbytes:
            continue
        if offset > end:
            buf[end:offset].zero_()
        end = offset + nbytes
        if tensor.device.type == "cpu":
            on_cpu.append((tensor, offset, nbytes))
        else:
            # non_blocking only matters for device tensors into pinned memory: the copy is queued
            # on the current stream, so later kernels cannot overwrite the source before it ran
            _typed_view(buf, tensor, offset, nbytes).copy_(tensor, non_blocking=pinned)
    if layout.payload_size > end:
        buf[end : layout.payload_size].zero_()
    _copy_cpu(buf, on_cpu)


def _typed_view(buf: torch.Tensor, tensor: torch.Tensor, offset: int, nbytes: int) -> torch.Tensor:
    return buf[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)


def _flat_bytes(tensor: torch.Tensor) -> torch.Tensor | None:
    """A flat uint8 view of a CPU tensor's bytes when it has one (contiguous, no lazy conj/neg)."""
    if not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg():
        return None
    try:
        return tensor.detach().reshape(-1).view(torch.uint8)
    except RuntimeError:
        return None


def _copy_cpu(buf: torch.Tensor, items: list[tuple[torch.Tensor, int, int]]) -> None:
    """Copy CPU tensors to their offsets in ``buf``. With enough bytes to copy, the plain byte
    ranges of contiguous tensors are split into equal spans copied by numpy on
    ``settings.copy_threads()`` threads (one memory stream per thread reaches only part of the
    machine's memory bandwidth); tensors that need torch to copy (strided views, lazy conj/neg)
    are copied on the calling thread, so no torch code runs on the pool's threads."""
    total = sum(nbytes for _, _, nbytes in items)
    threads = settings.copy_threads()
    if threads <= 1 or total < settings.copy_parallel_min_bytes():
        for tensor, offset, nbytes in items:
            _typed_view(buf, tensor, offset, nbytes).copy_(tensor)
        return
    flat: list[tuple[np.ndarray, np.ndarray]] = []
    for tensor, offset, nbytes in items:
        source = _flat_bytes(tensor)
        if source is None:
            _typed_view(buf, tensor, offset, nbytes).copy_(tensor)
        else:
            flat.append((buf[offset : offset + nbytes].numpy(), source.numpy()))
    share = -(-sum(src.size for _, src in flat) // threads)
    spans: list[list[tuple[np.ndarray, np.ndarray]]] = [[]]
    filled = 0
    for dst, src in flat:
        start = 0
        while start < src.size:
            if filled == share:
                spans.append([])
                filled = 0
            take = min(share - filled, src.size - start)
            spans[-1].append((dst[start : start + take], src[start : start + take]))
            filled += take
            start += take
    workpool.run_all(functools.partial(_copy_span, span) for span in spans if span)


def _copy_span(span: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for target, source in span:
        np.copyto(target, source)


def snapshot(state: State) -> tuple[bytes, np.ndarray]:
    """``(header, payload)`` of ``state``: :func:`build_layout`, then :func:`write_payload` into a new
    uint8 array of exactly ``payload_size`` bytes."""
    layout = build_layout(state)
    payload = np.empty(layout.payload_size, dtype=np.uint8)
    write_payload(layout, payload)
    return layout.header, payload


class _TreeEncoder:
    """A state tree -> the header's node tree, collecting its tensors in payload order (once each)."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self._index: dict[int, int] = {}
        self.version = 1  # the lowest format version that holds what was seen so far
        self._locals: list[torch.Tensor] = []

    def encode(self, obj: Any, path: _Path, depth: int) -> list[Any]:
        kind = type(obj)
        if kind in _PLAIN_TYPES:
            if kind is int and not _INT_MIN <= obj <= _INT_MAX:
                self.version = 3
                return ["I", obj.to_bytes(obj.bit_length() // 8 + 1, "little", signed=True)]
            _check_plain(obj, path)
            return ["v", obj]
        if isinstance(obj, torch.Tensor):
            if dtensor.is_dtensor(obj):
                return ["D", self._dtensor(obj, path)]
            return ["T", self._tensor(obj, path)]
        if kind is np.ndarray:
            return ["A", self._array(obj, path)]
        if isinstance(obj, np.generic) and kind is obj.dtype.type and obj.dtype.kind in _SCALAR_KINDS:
            self.version = 3
            return ["S", [obj.dtype.str, obj.tobytes()]]
        if depth >= MAX_DEPTH:
            raise _unsupported(path, obj, f"containers are nested deeper than {MAX_DEPTH} levels (a cycle?)")
        if kind is dict or kind is collections.OrderedDict:
            pairs = []
            for key, value in obj.items():
                if type(key) is str or type(key) is int:
                    _check_plain(key, path, "dict key")
                else:
                    raise _unsupported(
                        path, key, f"dict key {key!r} of type {type(key).__name__}: keys must be str or int"
                    )
                pairs.append([key, self.encode(value, (path, key), depth + 1)])
            return ["d" if kind is dict else "o", pairs]
        if kind is list or kind is tuple:
            items = [self.encode(value, (path, i), depth + 1) for i, value in enumerate(obj)]
            return ["l" if kind is list else "t", items]
        raise _unsupported(path, obj, _hint(obj))

    def _dtensor(self, tensor: torch.Tensor, path: _Path) -> dict[str, Any]:
        try:
            shard = dtensor.describe(tensor)
        except ValueError as error:
            raise _unsupported(path, tensor, f"DTensor: {error}") from None
        self.version = max(self.version, 2)
        self._locals.append(shard.local)  # alive while encoding: _index is keyed by id()
        return {"local": self._tensor(shard.local, path), **shard.layout()}

    def _array(self, array: np.ndarray, path: _Path) -> list[Any]:
        dtype = array.dtype
        if not _keepable(dtype, _ARRAY_KINDS):
            raise _unsupported(
                path, array, f"numpy array of dtype {dtype}: convert it to a list, or to an array of a numeric dtype"
            )
        if array.nbytes > MAX_ARRAY_BYTES:
            raise _unsupported(
                path,
                array,
                f"numpy array of {array.nbytes} bytes, more than the {MAX_ARRAY_BYTES} kept as a value: convert "
                "it with torch.from_numpy (it then comes back as a tensor)",
            )
        self.version = 3
        return [dtype.str, list(array.shape), array.tobytes()]

    def _tensor(self, tensor: torch.Tensor, path: _Path) -> int:
        index = self._index.get(id(tensor))
        if index is not None:
            return index
        if type(tensor) is not torch.Tensor and type(tensor) is not torch.nn.Parameter:
            raise _unsupported(path, tensor, f"tensor subclass {type(tensor).__name__}: convert it to a plain tensor")
        if tensor.layout != torch.strided or tensor.is_nested:
            raise _unsupported(path, tensor, f"{tensor.layout} tensor: only dense (strided) tensors")
        if tensor.device.type == "meta":
            raise _unsupported(path, tensor, "tensor on the meta device has no data")
        if tensor.dtype not in _NAMES:
            raise _unsupported(path, tensor, f"tensor dtype {tensor.dtype} is not supported")
        index = len(self.tensors)
        self._index[id(tensor)] = index
        self.tensors.append(tensor.detach())
        return index


def _keepable(dtype: np.dtype[Any], kinds: str) -> bool:
    """Whether a numpy dtype is one of ``kinds``, fixed-size and unstructured (its bytes are its values)."""
    return dtype.kind in kinds and dtype.itemsize > 0 and dtype.fields is None and dtype.subdtype is None


def _check_plain(value: Any, path: _Path, what: str = "value") -> None:
    if type(value) is int and not _INT_MIN <= value <= _INT_MAX:
        raise _unsupported(path, value, f"{what} {value} is outside the 64-bit int range: use str({what})")
    if type(value) is str and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _unsupported(path, value, f"{what} {value!r} is not valid UTF-8") from None


def _hint(obj: Any) -> str:
    name = type(obj).__name__
    if isinstance(obj, np.ndarray):
        return f"numpy array subclass {name}: convert it with np.asarray"
    if isinstance(obj, np.generic):
        return f"numpy scalar {name}: convert it with .item()"
    if isinstance(obj, (set, frozenset)):
        return f"{name}: use a sorted list or a tuple"
    if isinstance(obj, (bytearray, memoryview)):
        return f"{name}: convert it with bytes()"
    if isinstance(obj, torch.Generator):
        return "torch.Generator: save generator.get_state() (a tensor) and restore it with set_state()"
    if isinstance(obj, (np.random.Generator, np.random.BitGenerator)):
        return f"numpy {name}: save its bit_generator.state (a dict) and set it back on restore"
    if isinstance(obj, np.random.RandomState):
        return "numpy RandomState: save its get_state() and restore it with set_state()"
    if isinstance(obj, (torch.dtype, torch.device)):
        return f"{name}: save str() of it"
    if isinstance(obj, tuple):
        return f"tuple subclass {name}: convert it to a plain tuple or dict"
    if isinstance(obj, (dict, Mapping)):
        return f"mapping type {name}: convert it to a dict"
    if isinstance(obj, list):
        return f"list subclass {name}: convert it to a list"
    return (
        f"unsupported type {type(obj).__module__}.{type(obj).__qualname__} (nothing is pickled): save its "
        "state_dict(), or a dict of its fields, and rebuild it on restore"
    )


def _unsupported(path: _Path, obj: Any, reason: str) -> UnsupportedLeafError:
    """Names the leaf (key path), its type and the fix (``reason``); the full list of what is
    supported is in the docs, not repeated in every message."""
    key_path = _format_path(path)
    kind = (
        type(obj).__qualname__
        if type(obj).__module__ == "builtins"
        else f"{type(obj).__module__}.{type(obj).__qualname__}"
    )
    return UnsupportedLeafError(
        f"cannot snapshot {key_path} ({kind}): {reason} ({_SUPPORTED})",
        key_path=key_path,
        leaf_type=type(obj).__name__,
    )


def _format_path(path: _Path) -> str:
    """Render a key path as ``state['a'][0]['b']``."""
    keys = []
    while path:
        path, key = path
        keys.append(f"[{key!r}]")
    return "state" + "".join(reversed(keys))


# ---- header + payload -> state ----------------------------------------------------------------


def restore(header: bytes, payload: Any, *, copy: bool = True) -> State:
    """Rebuild the state from ``header`` and ``payload`` (a numpy array, CPU torch tensor or
    buffer holding at least the header's ``payload_size`` bytes; longer is fine).

    Every tensor descriptor is checked against the payload before any byte is read, and the
    tree as it is rebuilt: anything malformed, truncated or of another format version raises
    SnapshotFormatError (and nothing else). A ``header`` or ``payload`` that is not a buffer at
    all raises TypeError.

    Tensors come back as plain CPU tensors (``requires_grad=False``). With ``copy=True`` each
    owns its memory, so the caller may reuse the payload at once. With ``copy=False`` those of
    more than ``OWN_MEMORY_BYTES`` are views into ``payload`` (no copy; they change if it
    changes and keep it alive); the payload must then be writable (else ValueError),
    C-contiguous, and 64-byte aligned for aligned access. Smaller ones own their memory either
    way: torch calls that ignore a view's storage offset get the right bytes (``torch.set_rng_state``
    of a view into a payload crashes the process), and ``torch.save`` of one writes its own
    bytes, not the payload's.
    """
    with _gc_paused():
        return _restore(header, payload, copy)


def _restore(header: Any, payload: Any, copy: bool) -> State:
    version, payload_size, specs, tree = _parse_header(header)
    data = hostmem.as_bytes(payload, "payload")
    if data.size < payload_size:
        raise SnapshotFormatError(
            f"payload holds {data.size} bytes, the header says {payload_size}: truncated payload",
            payload_size=payload_size,
            received=data.size,
        )
    base: torch.Tensor | None = None
    if not copy:
        if not data.flags.writeable:
            raise ValueError("restore(copy=False) needs a writable payload; pass copy=True or a writable copy")
        base = torch.from_numpy(data)
    return _TreeDecoder(specs, data, base, version).decode(tree, (), 0)


_Spec = tuple[torch.dtype, tuple[int, ...], int, int]


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor lies in a payload (from :func:`read_layout`): ``nbytes`` bytes at
    ``offset``, holding ``shape`` of ``dtype`` in row-major order."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def read_layout(header: bytes) -> State:
    """The state's tree from ``header`` alone, every tensor a :class:`TensorRef` (a DTensor a
    SavedShard whose ``local`` is one): for reading only the bytes needed. Checked as
    :func:`restore` checks (SnapshotFormatError)."""
    version, _, specs, tree = _parse_header(header)
    return _TreeDecoder(specs, None, None, version).decode(tree, (), 0)


def _parse_header(header: Any) -> tuple[int, int, list[_Spec], Any]:
    if not isinstance(header, (bytes, bytearray, memoryview)):
        raise TypeError(f"header must be bytes, got {type(header).__name__}")
    try:
        meta = msgpack.unpackb(header, raw=False, strict_map_key=False, use_list=True)
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as exc:
        raise SnapshotFormatError(f"header is not valid msgpack: {exc}") from None
    if type(meta) is not dict or meta.get("magic") != MAGIC:
        raise SnapshotFormatError(f"header is not a ray_ckpt snapshot header (no magic {MAGIC!r})")
    version = meta.get("version")
    if type(version) is not int:
        raise SnapshotFormatError(f"header has no valid format version: {version!r}")
    if version not in READ_VERSIONS:
        newer = " (newer than this ray_ckpt; upgrade it)" if version > FORMAT_VERSION else ""
        raise SnapshotFormatError(
            f"snapshot format version {version}{newer}; this ray_ckpt reads versions {list(READ_VERSIONS)}",
            version=version,
        )
    payload_size = _count(meta.get("payload_size"), "payload_size")
    raw_specs = meta.get("tensors")
    if type(raw_specs) is not list:
        raise SnapshotFormatError("header field 'tensors' must be a list")
    specs = [_parse_spec(i, spec, payload_size) for i, spec in enumerate(raw_specs)]
    if "tree" not in meta:
        raise SnapshotFormatError("header has no 'tree'")
    return version, payload_size, specs, meta["tree"]


def _parse_spec(index: int, spec: Any, payload_size: int) -> _Spec:
    if type(spec) is not list or len(spec) != 4:
        raise _bad_spec(index, f"must be [dtype, shape, offset, nbytes], got {spec!r:.200}")
    name, shape, offset, nbytes = spec
    dtype = DTYPES.get(name) if type(name) is str else None
    if dtype is None:
        raise _bad_spec(index, f"has unknown dtype {name!r:.100}; known: {', '.join(DTYPES)}")
    if type(shape) is not list or len(shape) > MAX_DIMS:
        raise _bad_spec(index, f"shape must be a list of at most {MAX_DIMS} ints, got {shape!r:.200}")
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise _bad_spec(index, f"shape {shape!r:.200} must hold non-negative ints")
    if math.prod(max(dim, 1) for dim in shape) >= 2**63:
        raise _bad_spec(index, f"shape {shape!s:.200} is too large")
    for field, value in (("offset", offset), ("nbytes", nbytes)):
        if type(value) is not int or value < 0:
            raise _bad_spec(index, f"{field} must be a non-negative int, got {value!r:.100}")
    if nbytes != math.prod(shape) * dtype.itemsize:
        raise _bad_spec(index, f"nbytes {nbytes} does not match shape {shape!s:.200} of {name}")
    if offset % ALIGNMENT:
        raise _bad_spec(index, f"offset {offset} is not a multiple of {ALIGNMENT}")
    if offset + nbytes > payload_size:
        raise _bad_spec(index, f"bytes [{offset}, {offset + nbytes}) run past the payload end {payload_size}")
    return dtype, tuple(shape), offset, nbytes


def _bad_spec(index: int, problem: str) -> SnapshotFormatError:
    return SnapshotFormatError(f"header tensors[{index}] {problem}", tensor=index)


def _count(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise SnapshotFormatError(f"header {what} must be a non-negative int, got {value!r:.100}")
    return value


class _TreeDecoder:
    """The header's node tree -> a state tree: tensors over the payload (or TensorRefs without one),
    every node checked."""

    def __init__(self, specs: list[_Spec], data: np.ndarray | None, base: torch.Tensor | None, version: int) -> None:
        self.specs = specs
        self.version = version
        self.data = data
        self.base = base
        self.tensors: list[Any] = [None] * len(specs)

    def decode(self, node: Any, path: _Path, depth: int) -> Any:
        if type(node) is not list or len(node) != 2 or type(node[0]) is not str:
            raise _bad_node(path, f"malformed node {node!r:.100}")
        if depth > MAX_DEPTH:
            raise _bad_node(path, f"nested deeper than {MAX_DEPTH} levels")
        tag, body = node
        if tag == "v":
            if type(body) not in _PLAIN_TYPES:
                raise _bad_node(path, f"value of type {type(body).__name__} is not allowed")
            return body
        if tag == "T":
            if type(body) is not int or not 0 <= body < len(self.specs):
                raise _bad_node(path, f"tensor index {body!r:.100} out of range 0..{len(self.specs) - 1}")
            return self.tensor(body)
        if tag == "D" and self.version >= 2:
            return self.shard(body, path)
        if self.version >= 3 and tag in ("I", "A", "S"):
            return self.value(tag, body, path)
        if type(body) is not list:
            raise _bad_node(path, f"body of a {tag!r:.20} node must be a list")
        if tag == "l" or tag == "t":
            items = [self.decode(item, (path, i), depth + 1) for i, item in enumerate(body)]
            return items if tag == "l" else tuple(items)
        if tag == "d" or tag == "o":
            result: dict[Any, Any] = {} if tag == "d" else collections.OrderedDict()
            for pair in body:
                if type(pair) is not list or len(pair) != 2 or type(pair[0]) not in (str, int):
                    raise _bad_node(path, f"dict entry must be [str or int key, node], got {pair!r:.100}")
                key, value = pair
                result[key] = self.decode(value, (path, key), depth + 1)
            return result
        raise _bad_node(path, f"unknown node tag {tag!r:.20}")

    def value(self, tag: str, body: Any, path: _Path) -> Any:
        """A version-3 value node: a big int, a numpy array (new and writable) or a numpy scalar."""
        if tag == "I":
            if type(body) is not bytes or not body:
                raise _bad_node(path, f"int node must hold bytes, got {body!r:.100}")
            return int.from_bytes(body, "little", signed=True)
        fields = 3 if tag == "A" else 2
        if type(body) is not list or len(body) != fields or type(body[-1]) is not bytes:
            raise _bad_node(
                path, f"numpy node must be [dtype, {'shape, ' if tag == 'A' else ''}bytes], got {body!r:.100}"
            )
        dtype = _numpy_dtype(body[0], _ARRAY_KINDS if tag == "A" else _SCALAR_KINDS)
        if dtype is None:
            raise _bad_node(path, f"numpy dtype {body[0]!r:.50} is not one a snapshot holds")
        raw: bytes = body[-1]
        if tag == "S":
            if len(raw) != dtype.itemsize:
                raise _bad_node(path, f"numpy scalar of {dtype} holds {len(raw)} bytes, not {dtype.itemsize}")
            return np.frombuffer(raw, dtype=dtype)[0]
        shape = body[1]
        if type(shape) is not list or len(shape) > MAX_DIMS or any(type(d) is not int or d < 0 for d in shape):
            raise _bad_node(path, f"numpy shape must be a list of at most {MAX_DIMS} non-negative ints")
        if len(raw) != math.prod(shape) * dtype.itemsize or math.prod(max(d, 1) for d in shape) >= 2**63:
            raise _bad_node(path, f"numpy array of {dtype} {shape!s:.100} cannot hold {len(raw)} bytes")
        try:
            array = np.empty(shape, dtype=dtype)
        except (ValueError, MemoryError) as exc:
            raise _bad_node(path, f"numpy array of {dtype} {shape!s:.100} cannot be made: {exc}") from None
        if raw:
            array.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, dtype=np.uint8)
        return array

    def shard(self, body: Any, path: _Path) -> dtensor.SavedShard:
        if type(body) is not dict:
            raise _bad_node(path, f"DTensor node must be a map, got {body!r:.100}")
        index = body.get("local")
        if type(index) is not int or not 0 <= index < len(self.specs):
            raise _bad_node(path, f"DTensor local tensor index {index!r:.100} out of range")
        try:
            layout = dtensor.layout_of(body)
        except ValueError as error:
            raise _bad_node(path, f"DTensor layout: {error}") from None
        local = self.tensor(index)
        shape, offsets = dtensor.block(
            layout["global_shape"], layout["mesh_shape"], layout["placements"], layout["coordinate"]
        )
        found = (tuple(local.shape), layout["offsets"])
        if found != (shape, offsets):
            raise _bad_node(path, f"DTensor local shard {found[0]} at {found[1]} is not its block {shape} at {offsets}")
        return dtensor.SavedShard(local=local, **layout)

    def tensor(self, index: int) -> Any:
        """The tensor (a TensorRef without payload data), made once per index."""
        made = self.tensors[index]
        if made is None:
            dtype, shape, offset, nbytes = self.specs[index]
            try:
                if self.data is None:
                    made = TensorRef(dtype, shape, offset, nbytes)
                elif not nbytes:
                    made = torch.empty(shape, dtype=dtype)
                elif self.base is not None and nbytes > OWN_MEMORY_BYTES:
                    made = self.base[offset : offset + nbytes].view(dtype).view(shape)
                else:
                    raw = torch.empty(nbytes, dtype=torch.uint8)
                    np.copyto(raw.numpy(), self.data[offset : offset + nbytes])
                    made = raw.view(dtype).view(shape)
            except RuntimeError as exc:  # pragma: no cover - the header checks should prevent it
                raise _bad_spec(index, f"cannot be rebuilt: {exc}") from None
            self.tensors[index] = made
        return made


def _numpy_dtype(name: Any, kinds: str) -> np.dtype[Any] | None:
    """The numpy dtype a header names (its ``dtype.str``), or None when it names none of ``kinds``."""
    if type(name) is not str or len(name) > 32:
        return None
    try:
        dtype = np.dtype(name)
    except Exception:  # numpy's parser raises several types for malformed names
        return None
    return dtype if dtype.str == name and _keepable(dtype, kinds) else None


def _bad_node(path: _Path, problem: str) -> SnapshotFormatError:
    return SnapshotFormatError(f"header tree at {_format_path(path)}: {problem}")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many small containers that all survive:
    otherwise they trigger repeated full collections (build_layout and restore of a 40k-tensor state
    run about 2-3x faster)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# ---- buffers ----------------------------------------------------------------------------------


def _writable_bytes(out: Any) -> torch.Tensor:
    """A flat uint8 CPU tensor over ``out``'s memory with storage offset 0 (so dtype views of
    64-aligned slices are always allowed)."""
    if isinstance(out, torch.Tensor):
        if out.device.type != "cpu":
            raise ValueError(f"out must be a CPU tensor, got one on {out.device}")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous")
        array = out.detach().reshape(-1).view(torch.uint8).numpy()
    elif isinstance(out, np.ndarray):
        if not out.flags.c_contiguous:
            raise ValueError("out must be a C-contiguous array")
        if not out.flags.writeable:
            raise ValueError("out is read-only")
        array = out.reshape(-1).view(np.uint8)
    else:
        try:
            view = memoryview(out)
        except TypeError:
            raise TypeError(
                f"out must be a numpy array, CPU tensor or writable buffer, got {type(out).__name__}"
            ) from None
        if view.readonly or not view.c_contiguous:
            raise ValueError("out must be a writable C-contiguous buffer")
        array = np.frombuffer(view, dtype=np.uint8) if view.nbytes else np.zeros(0, dtype=np.uint8)
    return torch.from_numpy(array)
