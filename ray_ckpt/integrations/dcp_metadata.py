"""DCP's ``Metadata`` as explicit, versioned msgpack: what PeerMemoryWriter saves with a step and
PeerMemoryReader decodes, field by field, from peer memory. Nothing is pickled.

Every rank of a DCP load decodes the step's metadata from bytes in peer memory; DCP's own file
format pickles it, which would run whatever a crafted step holds in every rank that loads it.
The encoding (msgpack, ``use_bin_type=True``) holds DCP's plain dataclasses and nothing else::

    {"format": FORMAT, "version": VERSION,
     "state_dict_metadata": [[fqn, entry], ...],
     "planner_data": None | [[fqn, [key, ...]], ...],
     "storage_data": [[index, span], ...],
     "storage_meta": None | [checkpoint_id, save_id, load_id, [module, ...]],
     "dcp_version": None | str}

- ``entry``: ``["bytes"]`` (``BytesStorageMetadata``) or ``["tensor", dtype, size, chunks,
  [layout, requires_grad, memory_format, pin_memory]]`` (``TensorStorageMetadata`` and its
  ``TensorProperties``), each chunk ``[offsets, sizes]``. Dtypes, layouts and memory formats by
  name (``"float32"``, ``"strided"``, ``"contiguous_format"``); sizes and offsets are lists of
  ints >= 0, a chunk inside its tensor.
- ``planner_data``: DefaultSavePlanner's ``{fqn: key path}`` (each key a str or an int, the
  path a tuple), or None. Other planner data cannot be saved here (ConfigError at the save).
- ``index``: a ``MetadataIndex``, ``[fqn, offset or None, index hint or None]``; ``span``: its
  :class:`PeerSpan`, ``[step, rank, key, offset, nbytes, dtype, shape]``.
- ``storage_meta``: DCP's ``StorageMeta`` (``checkpoint_id`` as a str); ``dcp_version``:
  ``Metadata.version``.

:func:`decode_metadata` accepts exactly this: a payload that is not msgpack, of another format
or version, with an unknown type tag or name, a field of the wrong type or count, a duplicate
key, a span of another step or one for an fqn the metadata does not hold raises
:class:`~ray_ckpt.errors.DcpMetadataError` saying the step's metadata is malformed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import msgpack
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ray_ckpt.core.snapshot import DTYPES, MAX_DIMS, TensorRef
from ray_ckpt.errors import ConfigError, DcpMetadataError

__all__ = ["FORMAT", "VERSION", "PeerSpan", "decode_metadata", "dtype_name", "encode_metadata"]

FORMAT = "ray_ckpt.dcp.metadata"
VERSION = 1

_LAYOUTS: dict[str, torch.layout] = {
    name: getattr(torch, name)
    for name in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn")
    if isinstance(getattr(torch, name, None), torch.layout)
}
_MEMORY_FORMATS: dict[str, torch.memory_format] = {  # the three DCP's own pickling knows
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "preserve_format": torch.preserve_format,
}
_MAX = 2**63  # every size, offset and count is below it
_FIELDS = ("format", "version", "state_dict_metadata", "planner_data", "storage_data", "storage_meta", "dcp_version")


def dtype_name(dtype: torch.dtype) -> str:
    """``dtype``'s name as the snapshot header writes it (``"float32"``)."""
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(frozen=True)
class PeerSpan:
    """Where one DCP item lies (``WriteResult.storage_data``): bytes ``[offset, offset +
    nbytes)`` of old rank ``rank``'s payload of ``step``, under ``key`` in its ``items``,
    holding ``shape`` of ``dtype`` (a torch dtype's name) in row-major order."""

    step: int
    rank: int
    key: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]

    def matches(self, ref: Any) -> bool:
        """Whether the old rank's header entry ``ref`` describes these bytes."""
        return (
            isinstance(ref, TensorRef)
            and (ref.offset, ref.nbytes, tuple(ref.shape)) == (self.offset, self.nbytes, self.shape)
            and dtype_name(ref.dtype) == self.dtype
        )


_SPAN_FIELDS = tuple(field.name for field in dataclasses.fields(PeerSpan))  # a span's order on the wire


# ---- Metadata -> bytes (the coordinator's finish) ----------------------------------------------


def encode_metadata(metadata: Metadata) -> bytes:
    """``metadata``, its ``storage_data`` a ``{MetadataIndex: PeerSpan}``, as the msgpack above.
    ConfigError for what the encoding cannot hold (another planner's data, a dtype or memory
    format it has no name for), naming it."""
    spans = metadata.storage_data
    if not isinstance(spans, dict) or not all(isinstance(s, PeerSpan) for s in spans.values()):
        raise ConfigError("the metadata's storage_data must map each MetadataIndex to its PeerSpan")
    body = {
        "format": FORMAT,
        "version": VERSION,
        "state_dict_metadata": [[fqn, _entry(fqn, value)] for fqn, value in metadata.state_dict_metadata.items()],
        "planner_data": _planner_data(metadata.planner_data),
        "storage_data": [
            [[index.fqn, _ints(index.offset), index.index], [getattr(span, name) for name in _SPAN_FIELDS]]
            for index, span in spans.items()
        ],
        "storage_meta": _storage_meta(metadata.storage_meta),
        "dcp_version": metadata.version,
    }
    try:
        return msgpack.packb(body, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as error:
        raise ConfigError(f"DCP's metadata holds a value the peer-memory encoding cannot hold: {error}") from None


def _ints(values: Any) -> list[int] | None:
    return None if values is None else [int(v) for v in values]


def _entry(fqn: str, value: Any) -> list[Any]:
    if isinstance(value, BytesStorageMetadata):
        return ["bytes"]
    if not isinstance(value, TensorStorageMetadata):
        raise ConfigError(f"{fqn!r}: DCP metadata entry of unknown type {type(value).__name__}")
    props = value.properties
    names = {
        "dtype": (dtype_name(props.dtype), DTYPES),
        "layout": (str(props.layout).removeprefix("torch."), _LAYOUTS),
        "memory_format": (str(props.memory_format).removeprefix("torch."), _MEMORY_FORMATS),
    }
    for what, (name, known) in names.items():
        if name not in known:
            raise ConfigError(f"{fqn!r}: a tensor of {what} {name}, which DCP into peer memory cannot hold")
    chunks = [[_ints(chunk.offsets), _ints(chunk.sizes)] for chunk in value.chunks]
    flags = [names["layout"][0], bool(props.requires_grad), names["memory_format"][0], bool(props.pin_memory)]
    return ["tensor", names["dtype"][0], _ints(value.size), chunks, flags]


def _planner_data(data: Any) -> list[Any] | None:
    if data is None:
        return None
    if isinstance(data, dict) and all(
        type(fqn) is str
        and type(path) is tuple
        and all(type(key) is str or (type(key) is int and -(2**63) <= key < 2**64) for key in path)
        for fqn, path in data.items()
    ):
        return [[fqn, list(path)] for fqn, path in data.items()]
    raise ConfigError(
        "PeerMemoryWriter saves DCP's DefaultSavePlanner data ({fqn: tuple of str and int keys}) or None; "
        f"this planner's planner_data ({type(data).__name__}) is something else: save with a planner "
        "derived from DefaultSavePlanner"
    )


def _storage_meta(meta: StorageMeta | None) -> list[Any] | None:
    if meta is None:
        return None
    checkpoint_id = None if meta.checkpoint_id is None else str(meta.checkpoint_id)
    return [checkpoint_id, meta.save_id, meta.load_id, list(meta.modules)]


# ---- bytes -> Metadata (every rank's read_metadata) ---------------------------------------------


def decode_metadata(data: bytes, step: int) -> Metadata:
    """The Metadata ``data`` encodes, every field checked, its ``storage_data`` a
    ``{MetadataIndex: PeerSpan}`` of ``step``; DcpMetadataError for anything else."""
    return _Decoder(step).metadata(data)


class _Decoder:
    def __init__(self, step: int) -> None:
        self.step = step

    def bad(self, where: str, problem: str) -> DcpMetadataError:
        return DcpMetadataError(
            f"step {self.step}'s DCP metadata is malformed: {where} {problem}. Nothing of it was unpickled; "
            "load another step",
            step=self.step,
            where=where,
        )

    def metadata(self, data: bytes) -> Metadata:
        try:
            body = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
        except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as error:
            raise self.bad("the payload", f"is not msgpack ({str(error) or type(error).__name__})") from None
        if type(body) is not dict or body.get("format") != FORMAT:
            raise self.bad("the payload", f"is not ray_ckpt's encoding of DCP metadata (format {FORMAT!r})")
        version = body.get("version")
        if type(version) is not int or version != VERSION:
            newer = type(version) is int and version > VERSION
            raise self.bad(
                "the payload",
                f"has version {version!r:.50}, this ray_ckpt reads version {VERSION}"
                + (" (a newer ray_ckpt saved it: upgrade this one)" if newer else ""),
            )
        if set(body) != set(_FIELDS):
            raise self.bad("the payload", f"has fields {sorted(map(str, body))!r:.300}, not {list(_FIELDS)}")
        entries = self.fqn_map(body["state_dict_metadata"], "state_dict_metadata", self.entry)
        storage_data: dict[MetadataIndex, PeerSpan] = {}
        for raw_index, span in self.pairs(body["storage_data"], "storage_data", self.span):
            index = self.index(raw_index)
            if index.fqn not in entries:
                raise self.bad(f"storage_data[{index.fqn!r}]", "names an fqn that state_dict_metadata does not hold")
            if index in storage_data:
                raise self.bad(f"storage_data[{index.fqn!r}]", f"holds offset {list(index.offset or [])} twice")
            storage_data[index] = span
        planner_data = body["planner_data"]
        if planner_data is not None:
            planner_data = self.fqn_map(planner_data, "planner_data", self.path)
        return Metadata(
            state_dict_metadata=entries,
            planner_data=planner_data,
            storage_data=storage_data,
            storage_meta=self.storage_meta(body["storage_meta"]),
            version=self.optional_str(body["dcp_version"], "dcp_version"),
        )

    def pairs(self, value: Any, where: str, decode: Callable[[Any, str], Any]) -> list[tuple[Any, Any]]:
        """``[[key, value], ...]``, each value decoded (the keys are left to the caller)."""
        if type(value) is not list:
            raise self.bad(where, f"must be a list of [key, value] pairs, got {type(value).__name__}")
        out = []
        for position, pair in enumerate(value):
            if type(pair) is not list or len(pair) != 2:
                raise self.bad(f"{where}[{position}]", f"must be a [key, value] pair, got {pair!r:.100}")
            label = f"{pair[0]!r:.100}" if type(pair[0]) is str else position  # the fqn, where it is one
            out.append((pair[0], decode(pair[1], f"{where}[{label}]")))
        return out

    def fqn_map(self, value: Any, where: str, decode: Callable[[Any, str], Any]) -> dict[str, Any]:
        """:meth:`pairs` as a dict, their keys fqns: strings, each once."""
        pairs = self.pairs(value, where, decode)
        if not all(type(key) is str for key, _ in pairs) or len(out := dict(pairs)) != len(pairs):
            raise self.bad(where, "must have distinct str keys (fqns)")
        return out

    def entry(self, value: Any, where: str) -> BytesStorageMetadata | TensorStorageMetadata:
        if type(value) is not list or not value or type(value[0]) is not str:
            raise self.bad(where, f"must be a tagged list ['bytes'] or ['tensor', ...], got {value!r:.100}")
        tag = value[0]
        if tag == "bytes":
            if len(value) != 1:
                raise self.bad(where, f"must be ['bytes'], got {value!r:.100}")
            return BytesStorageMetadata()
        if tag != "tensor":
            raise self.bad(where, f"has unknown type tag {tag!r:.50} (known: 'bytes', 'tensor')")
        if len(value) != 5:
            raise self.bad(where, "must be ['tensor', dtype, size, chunks, properties]")
        _, dtype, size, chunks, flags = value
        shape = self.dims(size, f"{where} size")
        if type(chunks) is not list:
            raise self.bad(f"{where} chunks", "must be a list of [offsets, sizes]")
        if type(flags) is not list or len(flags) != 4:
            raise self.bad(f"{where} properties", "must be [layout, requires_grad, memory_format, pin_memory]")
        layout, requires_grad, memory_format, pin_memory = flags
        if type(requires_grad) is not bool or type(pin_memory) is not bool:
            raise self.bad(f"{where} properties", "requires_grad and pin_memory must be bools")
        properties = TensorProperties(
            dtype=self.named(dtype, DTYPES, f"{where} dtype"),
            layout=self.named(layout, _LAYOUTS, f"{where} layout"),
            requires_grad=requires_grad,
            memory_format=self.named(memory_format, _MEMORY_FORMATS, f"{where} memory_format"),
            pin_memory=pin_memory,
        )
        return TensorStorageMetadata(properties, shape, [self.chunk(c, shape, f"{where} chunks") for c in chunks])

    def chunk(self, value: Any, shape: torch.Size, where: str) -> ChunkStorageMetadata:
        if type(value) is not list or len(value) != 2:
            raise self.bad(where, f"must hold [offsets, sizes] pairs, got {value!r:.100}")
        offsets, sizes = self.dims(value[0], where), self.dims(value[1], where)
        if not len(offsets) == len(sizes) == len(shape) or any(
            o + n > d for o, n, d in zip(offsets, sizes, shape, strict=True)
        ):
            raise self.bad(where, f"has a chunk {list(offsets)}+{list(sizes)} outside the tensor {list(shape)}")
        return ChunkStorageMetadata(offsets=offsets, sizes=sizes)

    def index(self, value: Any) -> MetadataIndex:
        where = "storage_data index"
        if type(value) is not list or len(value) != 3 or type(value[0]) is not str:
            raise self.bad(where, f"must be [fqn, offset or None, index hint or None], got {value!r:.100}")
        fqn, offset, hint = value
        if hint is not None and (type(hint) is not int or hint < 0):
            raise self.bad(f"{where} of {fqn!r}", f"has index hint {hint!r:.50}, not an int >= 0 or None")
        return MetadataIndex(fqn, None if offset is None else self.dims(offset, f"{where} of {fqn!r}"), hint)

    def span(self, value: Any, where: str) -> PeerSpan:
        if type(value) is not list or len(value) != len(_SPAN_FIELDS):
            raise self.bad(where, f"must be a span {list(_SPAN_FIELDS)}, got {value!r:.100}")
        step, rank, key, offset, nbytes, dtype, shape = value
        counts = {"step": step, "rank": rank, "offset": offset, "nbytes": nbytes}
        for name, count in counts.items():
            if type(count) is not int or count < 0:
                raise self.bad(f"{where} span", f"has {name} {count!r:.50}, not an int >= 0")
        if step != self.step:
            raise self.bad(f"{where} span", f"names step {step}")
        if type(key) is not str:
            raise self.bad(f"{where} span", f"has key {key!r:.50}, not a str")
        dims = self.dims(shape, f"{where} span shape")
        itemsize = self.named(dtype, DTYPES, f"{where} span dtype").itemsize
        if nbytes != math.prod(dims) * itemsize:
            raise self.bad(f"{where} span", f"has {nbytes} bytes for shape {list(dims)} of {dtype}")
        return PeerSpan(step, rank, key, offset, nbytes, dtype, tuple(dims))

    def path(self, value: Any, where: str) -> tuple[str | int, ...]:
        if type(value) is not list or not all(type(key) in (str, int) for key in value):
            raise self.bad(where, f"must be a key path of str and int keys, got {value!r:.100}")
        return tuple(value)

    def storage_meta(self, value: Any) -> StorageMeta | None:
        if value is None:
            return None
        if type(value) is not list or len(value) != 4:
            raise self.bad("storage_meta", "must be [checkpoint_id, save_id, load_id, modules] or None")
        checkpoint_id, save_id, load_id, modules = value
        if type(modules) is not list or not all(type(m) is str for m in modules):
            raise self.bad("storage_meta modules", "must be a list of str")
        return StorageMeta(
            checkpoint_id=self.optional_str(checkpoint_id, "storage_meta checkpoint_id"),
            save_id=self.optional_str(save_id, "storage_meta save_id"),
            load_id=self.optional_str(load_id, "storage_meta load_id"),
            modules=modules,
        )

    def dims(self, value: Any, where: str) -> torch.Size:
        if type(value) is not list or len(value) > MAX_DIMS or not all(type(d) is int and 0 <= d < _MAX for d in value):
            raise self.bad(where, f"must be a list of at most {MAX_DIMS} ints in [0, 2**63), got {value!r:.100}")
        return torch.Size(value)

    def named(self, value: Any, known: Mapping[str, Any], where: str) -> Any:
        if type(value) is not str or value not in known:
            raise self.bad(where, f"is {value!r:.50}, not one of {', '.join(known)}")
        return known[value]

    def optional_str(self, value: Any, where: str) -> str | None:
        if value is not None and type(value) is not str:
            raise self.bad(where, f"must be a str or None, got {type(value).__name__}")
        return value
