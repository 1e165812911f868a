"""Systematic Reed-Solomon erasure code over GF(2^8): any k of k+m shards rebuild the payload.

The codec does NOT detect corruption: a shard whose bytes changed decodes to a wrong payload
without any error. Verify each shard's checksum (``ray_ckpt.core.checksum``) before handing it to
``decode``/``reconstruct`` and treat a bad one as missing.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ray_ckpt import settings
from ray_ckpt.config import MAX_SHARDS
from ray_ckpt.core import gf256, workpool
from ray_ckpt.core.hostmem import as_bytes, same_memory
from ray_ckpt.errors import ConfigError, InsufficientShardsError, ShardMismatchError

try:
    from ray_ckpt.core import _gf256

    KERNEL: str = _gf256.isa()
except ImportError:  # pragma: no cover - only without a compiler at install time
    _gf256 = None
    KERNEL = "numpy"
    warnings.warn(
        "ray_ckpt's compiled GF(2^8) kernel is not built; the codec falls back to numpy "
        "(~50x slower). Reinstall ray_ckpt with a C compiler available.",
        RuntimeWarning,
        stacklevel=2,
    )

_ALIGN = 64  # split work between threads on cache-line boundaries


class ReedSolomon:
    """RS(k, m): ``data_shards`` = k, ``parity_shards`` = m, ``1 <= k``, ``0 <= m``,
    ``k + m <= MAX_SHARDS`` (256). Systematic: shards 0..k-1 are the payload split in k equal slices
    (the last one zero-padded), shards k..k+m-1 are parity. m = 1 is plain XOR, m = 0 a split.

    Shards are equal-length uint8 arrays of ``shard_size(size)`` bytes; the caller keeps the
    payload size. Thread-safe: an instance holds only immutable tables.
    """

    def __init__(self, data_shards: int, parity_shards: int, *, threads: int | None = None):
        for name, value, low in (("data_shards", data_shards, 1), ("parity_shards", parity_shards, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
        if data_shards + parity_shards > MAX_SHARDS:
            raise ConfigError(
                f"data_shards + parity_shards = {data_shards + parity_shards} exceeds {MAX_SHARDS}, "
                "the most a code over GF(2^8) supports; lower one of them"
            )
        if threads is not None and threads < 1:
            raise ConfigError(f"threads must be >= 1 or None (automatic), got {threads}")
        self.data_shards = data_shards
        self.parity_shards = parity_shards
        self.total_shards = data_shards + parity_shards
        self.threads = threads
        self.parity_matrix = gf256.parity_matrix(data_shards, parity_shards)
        self.parity_matrix.setflags(write=False)
        self.generator = np.concatenate([np.eye(data_shards, dtype=np.uint8), self.parity_matrix], axis=0)
        self.generator.setflags(write=False)

    def __repr__(self) -> str:
        return f"ReedSolomon(data_shards={self.data_shards}, parity_shards={self.parity_shards})"

    def shard_size(self, payload_size: int) -> int:
        """Bytes per shard for a payload of ``payload_size`` bytes: ceil(size / k)."""
        if payload_size < 0:
            raise ValueError(f"payload size must be >= 0, got {payload_size}")
        return -(-payload_size // self.data_shards)

    # ---- encode -------------------------------------------------------------------------

    def split(self, payload: Any) -> list[np.ndarray]:
        """The k data shards: views into ``payload`` where they lie wholly inside it, a
        zero-padded copy for the (at most k-1) shards that run past its end."""
        data = as_bytes(payload)
        size = data.size
        length = self.shard_size(size)
        shards = []
        for i in range(self.data_shards):
            low, high = i * length, (i + 1) * length
            if high <= size:
                shards.append(data[low:high])
            else:
                shard = np.zeros(length, dtype=np.uint8)
                if low < size:
                    shard[: size - low] = data[low:size]
                shards.append(shard)
        return shards

    def encode(self, payload: Any) -> list[np.ndarray]:
        """All k+m shards of ``payload`` (data shards as in ``split``, then fresh parity)."""
        data = self.split(payload)
        return data + self.encode_parity(data)

    def encode_parity(self, data: Sequence[Any], out: Sequence[Any] | None = None) -> list[np.ndarray]:
        """The m parity shards of k equal-length data shards, written into ``out`` (m writable
        buffers of the same length) when given, so a hot path allocates nothing."""
        if len(data) != self.data_shards:
            raise ShardMismatchError(f"need {self.data_shards} data shards, got {len(data)}")
        inputs = _equal_lengths([as_bytes(d) for d in data], "data shards")
        length = inputs[0].size
        outputs = self._outputs(out, self.parity_shards, length)
        self._dot(self.parity_matrix, inputs, outputs, length)
        return outputs

    def verify(self, shards: Sequence[Any]) -> bool:
        """True when the k+m shards are consistent (parity matches data)."""
        if len(shards) != self.total_shards:
            raise ShardMismatchError(f"need all {self.total_shards} shards, got {len(shards)}")
        views = _equal_lengths([as_bytes(s) for s in shards], "shards")
        parity = self.encode_parity(views[: self.data_shards])
        return all(np.array_equal(p, q) for p, q in zip(parity, views[self.data_shards :]))

    # ---- decode -------------------------------------------------------------------------

    def decode(self, shards: Mapping[int, Any], size: int) -> np.ndarray:
        """The first ``size`` bytes of the payload, rebuilt from any k of the shards
        (``{shard index: buffer}``). Raises InsufficientShardsError with fewer than k."""
        views = self._check_shards(shards)
        length = next(iter(views.values())).size
        if length != self.shard_size(size):
            raise ShardMismatchError(
                f"shards of {length} bytes cannot hold a payload of {size} bytes: "
                f"RS({self.data_shards},{self.parity_shards}) shards of that payload have "
                f"{self.shard_size(size)} bytes; check the payload size recorded with them"
            )
        out = np.empty(self.data_shards * length, dtype=np.uint8)
        self._decode_views(views, out)
        return out[:size]

    def decode_into(self, shards: Mapping[int, Any], out: Any) -> None:
        """Rebuild the padded payload, k * shard length bytes, into the start of ``out``."""
        self._decode_views(self._check_shards(shards), as_bytes(out))

    def _decode_views(self, views: dict[int, np.ndarray], target: np.ndarray) -> None:
        length = next(iter(views.values())).size
        k = self.data_shards
        if target.size < k * length:
            raise ValueError(f"out holds {target.size} bytes, needs k * shard length = {k * length}")
        slots = [target[i * length : (i + 1) * length] for i in range(k)]
        missing = [i for i in range(k) if i not in views]
        for i in range(k):
            if i in views and not same_memory(slots[i], views[i]):  # a shard fetched into its place stays
                np.copyto(slots[i], views[i])
        if missing:
            used, matrix = self._recovery_rows(tuple(sorted(views)), tuple(missing))
            self._dot(matrix, [views[i] for i in used], [slots[i] for i in missing], length)

    def reconstruct(self, shards: Mapping[int, Any], indices: Iterable[int]) -> dict[int, np.ndarray]:
        """Rebuild the shards at ``indices`` (data or parity) from any k given ones, e.g. to
        re-protect a checkpoint after a node loss. Returns ``{index: new shard}``."""
        targets = tuple(sorted(set(indices)))
        for index in targets:
            if not 0 <= index < self.total_shards:
                raise ValueError(f"shard index {index} is outside 0..{self.total_shards - 1}")
        views = self._check_shards(shards)
        length = next(iter(views.values())).size
        result: dict[int, np.ndarray] = {}
        todo = []
        for index in targets:
            if index in views:
                result[index] = views[index].copy()
            else:
                todo.append(index)
        if todo:
            used, matrix = self._recovery_rows(tuple(sorted(views)), tuple(todo))
            outputs = [np.empty(length, dtype=np.uint8) for _ in todo]
            self._dot(matrix, [views[i] for i in used], outputs, length)
            result.update(zip(todo, outputs))
        return result

    def recovery_matrix(self, available: Sequence[int], targets: Sequence[int]) -> tuple[tuple[int, ...], np.ndarray]:
        """(the k shard indices to read, the len(targets) x k matrix that maps them to the
        target shards). Prefers data shards, whose rows cost nothing to invert."""
        return self._recovery_rows(tuple(sorted(available)), tuple(targets))

    @functools.lru_cache(maxsize=256)  # noqa: B019 - instances are few and long-lived
    def _recovery_rows(
        self, available: tuple[int, ...], targets: tuple[int, ...]
    ) -> tuple[tuple[int, ...], np.ndarray]:
        k = self.data_shards
        if len(available) < k:
            raise InsufficientShardsError(
                f"need {k} shards to decode, got {len(available)}", needed=k, available=len(available)
            )
        data_first = [i for i in available if i < k] + [i for i in available if i >= k]
        used = tuple(data_first[:k])
        decode = gf256.invert(self.generator[list(used)])
        matrix = gf256.matmul(self.generator[list(targets)], decode)
        matrix.setflags(write=False)
        return used, matrix

    # ---- internals ----------------------------------------------------------------------

    def _check_shards(self, shards: Mapping[int, Any]) -> dict[int, np.ndarray]:
        views: dict[int, np.ndarray] = {}
        for index, shard in shards.items():
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
                raise ValueError(f"shard keys must be int indices, got {index!r}")
            if not 0 <= index < self.total_shards:
                raise ValueError(f"shard index {index} is outside 0..{self.total_shards - 1}")
            views[int(index)] = as_bytes(shard)
        if len(views) < self.data_shards:
            raise InsufficientShardsError(
                f"need {self.data_shards} of {self.total_shards} shards to decode, got "
                f"{len(views)} (indices {sorted(views)})",
                needed=self.data_shards,
                available=len(views),
            )
        _equal_lengths(list(views.values()), "shards")
        return views

    def _outputs(self, out: Sequence[Any] | None, count: int, length: int) -> list[np.ndarray]:
        if out is None:
            return [np.empty(length, dtype=np.uint8) for _ in range(count)]
        if len(out) != count:
            raise ShardMismatchError(f"out must hold {count} buffers, got {len(out)}")
        views = [as_bytes(o) for o in out]
        for i, view in enumerate(views):
            if view.size != length:
                raise ShardMismatchError(f"out[{i}] holds {view.size} bytes, expected {length}")
            if not view.flags.writeable:
                raise ValueError(f"out[{i}] is read-only")
        return views

    def _dot(self, matrix: np.ndarray, inputs: list[np.ndarray], outputs: list[np.ndarray], length: int) -> None:
        if not outputs or length == 0:
            return
        if _gf256 is None:
            gf256.dot_numpy(matrix, inputs, outputs, 0, length)
            return
        coefficients = matrix.tobytes()
        rows, cols = matrix.shape
        threads = self.threads or settings.codec_threads()
        total = length * (len(inputs) + len(outputs))
        if threads > 1 and total >= settings.codec_parallel_min_bytes():
            step = -(-length // threads)
            step = -(-step // _ALIGN) * _ALIGN
            bounds = [(lo, min(lo + step, length)) for lo in range(0, length, step)]
            workpool.run_all(
                functools.partial(_gf256.dot, coefficients, rows, cols, inputs, outputs, lo, hi) for lo, hi in bounds
            )
        else:
            _gf256.dot(coefficients, rows, cols, inputs, outputs, 0, length)


def _equal_lengths(views: list[np.ndarray], what: str) -> list[np.ndarray]:
    lengths = {v.size for v in views}
    if len(lengths) > 1:
        raise ShardMismatchError(f"{what} must all have the same length, got lengths {sorted(lengths)}")
    return views
