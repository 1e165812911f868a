"""Reed-Solomon on torch tensors (GPU parity before the device->host copy), bit-identical to codec.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.errors import InsufficientShardsError, ShardMismatchError

__all__ = ["decode", "encode_parity"]

_LOW7 = 0x7F7F7F7F7F7F7F7F  # the low 7 bits of every byte of a word
_BIT0 = 0x0101010101010101  # bit 0 of every byte of a word
_REDUCE = 0x1D  # x^8 = x^4 + x^3 + x^2 + 1 modulo the field polynomial 0x11d
_WORD = 8  # bytes per int64 word

# Bytes of each shard processed per step. Working memory is at most (4 + m) times this; a CPU
# wants the step to stay in cache, a GPU wants it large enough to hide kernel launches.
_CHUNK_BYTES = {"cpu": 1 << 20}
_DEFAULT_CHUNK_BYTES = 16 << 20


def encode_parity(code: ReedSolomon, data: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The m parity shards, an (m, L) uint8 tensor on ``data``'s device, of the k data shards in
    ``data`` (a (k, L) uint8 tensor on any device). Written into ``out`` when given (an (m, L)
    uint8 tensor on the same device), so a hot path allocates nothing beyond its work buffers.
    Bit-identical to ``code.encode_parity`` on the same bytes."""
    k, m = code.data_shards, code.parity_shards
    _check_uint8(data, "data")
    if data.dim() != 2 or data.shape[0] != k:
        raise ShardMismatchError(
            f"data must be a (k, shard length) = ({k}, L) uint8 tensor, got shape {tuple(data.shape)}"
        )
    length = int(data.shape[1])
    if out is None:
        out = torch.empty((m, length), dtype=torch.uint8, device=data.device)
    else:
        _check_uint8(out, "out")
        if tuple(out.shape) != (m, length):
            raise ShardMismatchError(f"out must have shape ({m}, {length}), got {tuple(out.shape)}")
        if out.device != data.device:
            raise ValueError(f"out lives on {out.device} but data on {data.device}")
    _dot(code.parity_matrix, [data[j] for j in range(k)], [out[r] for r in range(m)], length)
    return out


def decode(code: ReedSolomon, shards: Mapping[int, torch.Tensor], size: int) -> torch.Tensor:
    """The first ``size`` bytes of the payload, a 1-D uint8 tensor on the shards' device, rebuilt
    from any k of the shards (``{shard index: 1-D uint8 tensor}``, all of one length and device).
    Raises InsufficientShardsError with fewer than k shards and ShardMismatchError when their
    lengths disagree with each other or with ``size``, like ``ReedSolomon.decode``."""
    k, total = code.data_shards, code.total_shards
    views: dict[int, torch.Tensor] = {}
    for index, shard in shards.items():
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise ValueError(f"shard keys must be int indices, got {index!r}")
        if not 0 <= index < total:
            raise ValueError(f"shard index {index} is outside 0..{total - 1}")
        _check_uint8(shard, f"shard {index}")
        if shard.dim() != 1:
            raise ShardMismatchError(f"shard {index} must be a 1-D tensor, got shape {tuple(shard.shape)}")
        views[int(index)] = shard
    if len(views) < k:
        raise InsufficientShardsError(
            f"need {k} of {total} shards to decode, got {len(views)} (indices {sorted(views)})",
            needed=k,
            available=len(views),
        )
    lengths = {int(v.shape[0]) for v in views.values()}
    if len(lengths) > 1:
        raise ShardMismatchError(f"shards must all have the same length, got lengths {sorted(lengths)}")
    devices = {v.device for v in views.values()}
    if len(devices) > 1:
        raise ValueError(f"shards must all live on one device, got {sorted(str(d) for d in devices)}")
    length = lengths.pop()
    device = devices.pop()
    if size < 0:
        raise ValueError(f"payload size must be >= 0, got {size}")
    if length != code.shard_size(size):
        raise ShardMismatchError(
            f"shards of {length} bytes cannot hold a payload of {size} bytes: "
            f"RS({k},{code.parity_shards}) shards of that payload have "
            f"{code.shard_size(size)} bytes; check the payload size recorded with them"
        )
    out = torch.empty(k * length, dtype=torch.uint8, device=device)
    slots = [out[i * length : (i + 1) * length] for i in range(k)]
    missing = [i for i in range(k) if i not in views]
    for i in range(k):
        if i in views:
            slots[i].copy_(views[i])
    if missing:
        used, matrix = code.recovery_matrix(sorted(views), missing)
        _dot(matrix, [views[i] for i in used], [slots[i] for i in missing], length)
    return out[:size]


def _check_uint8(tensor: object, what: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.uint8:
        raise TypeError(f"{what} must be a uint8 tensor, got {tensor.dtype}; view it as torch.uint8")


def _word_view(tensor: torch.Tensor) -> bool:
    """Whether a 1-D uint8 tensor can be viewed (no copy) as aligned int64 words."""
    return (
        tensor.stride(0) == 1
        and tensor.shape[0] % _WORD == 0
        and tensor.storage_offset() % _WORD == 0
        and tensor.data_ptr() % _WORD == 0
    )


def _dot(matrix: np.ndarray, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], length: int) -> None:
    """outputs[r] = XOR_j matrix[r, j] * inputs[j] over GF(2^8), for 1-D uint8 tensors of
    ``length`` bytes on one device.

    Only elementwise ops, no table gathers, so it runs at memory bandwidth on a GPU: ``c * x`` is
    the XOR, over the set bits b of c, of ``xtime^b(x)`` (``_xtime`` multiplies by 2). Bytes go
    eight at a time as int64 words (unaligned or odd-length shards through a zero-padded staging
    copy), each input's xtime powers are computed once per column chunk and XORed into every
    output row that needs them; coefficient 0 costs nothing and 1 a plain XOR. On CPU tensors it
    is correct but several times slower than the compiled kernel of ``ReedSolomon``."""
    rows, cols = matrix.shape
    if rows == 0 or length == 0:
        return
    if len(inputs) != cols or len(outputs) != rows:
        raise ShardMismatchError(f"a {rows}x{cols} matrix needs {cols} inputs and {rows} outputs")
    coefficients = matrix.tolist()
    # plan[j][b]: the rows whose coefficient for input j has bit b set; only up to the top bit
    # any row needs, so a column of 0s and 1s costs no xtime at all.
    plan: list[list[list[int]]] = []
    for j in range(cols):
        by_bit = [[r for r in range(rows) if coefficients[r][j] >> b & 1] for b in range(8)]
        top = max((b for b in range(8) if by_bit[b]), default=-1)
        plan.append(by_bit[: top + 1])

    device = inputs[0].device
    chunk = _CHUNK_BYTES.get(device.type, _DEFAULT_CHUNK_BYTES)
    chunk = max(_WORD, min(chunk, -(-length // _WORD) * _WORD))
    words = chunk // _WORD
    direct_in = [_word_view(t) for t in inputs]
    direct_out = all(_word_view(t) for t in outputs)

    def buffer() -> torch.Tensor:
        return torch.empty(words, dtype=torch.int64, device=device)

    powers = (buffer(), buffer())  # xtime^b of the current input, alternating
    carry = buffer()
    stage = buffer() if not all(direct_in) else None
    acc = torch.empty((rows, words), dtype=torch.int64, device=device) if not direct_out else None

    for low in range(0, length, chunk):
        high = min(low + chunk, length)
        n = high - low
        nw = -(-n // _WORD)
        if acc is None:
            targets = [t[low:high].view(torch.int64) for t in outputs]
        else:
            targets = [acc[r, :nw] for r in range(rows)]
        started = [False] * rows
        for j, source in enumerate(inputs):
            if not plan[j]:
                continue
            if direct_in[j]:
                current = source[low:high].view(torch.int64)
            else:
                if stage is None:  # pragma: no cover - allocated whenever an input needs it
                    raise RuntimeError("staging buffer missing")
                staged = stage.view(torch.uint8)
                staged[:n].copy_(source[low:high])
                if n % _WORD:
                    staged[n : nw * _WORD].zero_()
                current = stage[:nw]
            for bit, members in enumerate(plan[j]):
                if bit:
                    nxt = powers[bit % 2][:nw]
                    _xtime(current, nxt, carry[:nw])
                    current = nxt
                for r in members:
                    if started[r]:
                        targets[r].bitwise_xor_(current)
                    else:
                        targets[r].copy_(current)
                        started[r] = True
        for r in range(rows):
            if not started[r]:
                targets[r].zero_()
        if acc is not None:
            for r in range(rows):
                outputs[r][low:high].copy_(acc[r].view(torch.uint8)[:n])


def _xtime(x: torch.Tensor, out: torch.Tensor, carry: torch.Tensor) -> None:
    """out = 2 * x in GF(2^8), bytewise on int64 words (``carry`` is scratch). ``>>`` on int64
    is arithmetic, so the carries are masked after the shift."""
    torch.bitwise_right_shift(x, 7, out=carry)
    carry.bitwise_and_(_BIT0).mul_(_REDUCE)  # 0x1d in each byte whose top bit was set
    torch.bitwise_and(x, _LOW7, out=out)
    out.bitwise_left_shift_(1).bitwise_xor_(carry)
