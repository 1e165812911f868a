"""The torch codec is bit-identical to the numpy/C codec, on the CPU and (when present) CUDA."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_ckpt.core import codec_torch
from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.errors import InsufficientShardsError, ShardMismatchError

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")),
]
CODES = [(1, 0), (3, 0), (1, 1), (4, 1), (2, 2), (4, 2), (8, 2), (6, 3), (5, 5), (10, 4)]
SIZES = [0, 1, 7, 8, 9, 63, 64, 1000, 4099, 100_003]


def _payload(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _reference_parity(code: ReedSolomon, data: np.ndarray) -> np.ndarray:
    length = data.shape[1]
    if code.parity_shards == 0:
        return np.zeros((0, length), dtype=np.uint8)
    return np.stack(code.encode_parity(list(data)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("k", "m"), CODES)
def test_encode_matches_numpy(device: str, k: int, m: int) -> None:
    code = ReedSolomon(k, m)
    for size in SIZES:
        data = np.stack(code.split(_payload(size, seed=size)))
        parity = codec_torch.encode_parity(code, torch.from_numpy(data).to(device))
        assert parity.device.type == device
        assert parity.dtype == torch.uint8
        assert tuple(parity.shape) == (m, data.shape[1])
        np.testing.assert_array_equal(parity.cpu().numpy(), _reference_parity(code, data))


@pytest.mark.parametrize("device", DEVICES)
def test_encode_every_coefficient(device: str) -> None:
    # RS(8, 32)'s parity matrix holds many distinct coefficients, so every xtime power is used.
    code = ReedSolomon(8, 32)
    assert len(np.unique(code.parity_matrix)) > 100
    data = _payload(8 * 4096).reshape(8, 4096)
    data[:, :256] = np.arange(256, dtype=np.uint8)  # every byte value in every shard
    parity = codec_torch.encode_parity(code, torch.from_numpy(data).to(device))
    np.testing.assert_array_equal(parity.cpu().numpy(), _reference_parity(code, data))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("length", [0, 5, 64, 1001, (1 << 20) + 13, 3 << 20])
def test_encode_into_out_and_unaligned_views(device: str, length: int) -> None:
    code = ReedSolomon(6, 3)
    # A column slice starting at an odd offset: rows are strided, no row is word-aligned.
    wide = torch.from_numpy(_payload(6 * (length + 3), seed=length).reshape(6, length + 3)).to(device)
    data = wide[:, 3:]
    out = torch.full((3, length), 0xAB, dtype=torch.uint8, device=device)
    result = codec_torch.encode_parity(code, data, out=out)
    assert result is out
    expected = _reference_parity(code, np.ascontiguousarray(data.cpu().numpy()))
    np.testing.assert_array_equal(out.cpu().numpy(), expected)
    # Unaligned outputs too.
    wide_out = torch.zeros((3, length + 1), dtype=torch.uint8, device=device)
    codec_torch.encode_parity(code, data, out=wide_out[:, 1:])
    np.testing.assert_array_equal(wide_out[:, 1:].cpu().numpy(), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("k", "m"), [(1, 1), (2, 1), (3, 2), (4, 2), (4, 3), (3, 0)])
@pytest.mark.parametrize("size", [0, 1, 10, 4099])
def test_decode_from_every_subset(device: str, k: int, m: int, size: int) -> None:
    code = ReedSolomon(k, m)
    payload = _payload(size, seed=k * 100 + m)
    shards = [torch.from_numpy(s.copy()).to(device) for s in code.encode(payload)]
    for subset in itertools.combinations(range(k + m), k):
        result = codec_torch.decode(code, {i: shards[i] for i in subset}, size)
        assert result.device.type == device
        assert result.dtype == torch.uint8
        np.testing.assert_array_equal(result.cpu().numpy(), payload)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("k", "m"), [(4, 2), (8, 2), (6, 3), (10, 4)])
def test_round_trip_with_cpu_codec(device: str, k: int, m: int) -> None:
    """Parity made on torch decodes on the CPU codec and the other way round."""
    code = ReedSolomon(k, m)
    size = 200_003
    payload = _payload(size, seed=k + m)
    data = np.stack(code.split(payload))
    parity = codec_torch.encode_parity(code, torch.from_numpy(data).to(device)).cpu().numpy()
    shards = list(data) + list(parity)
    lost = range(m)  # worst case: the first m data shards are gone
    kept = {i: shards[i] for i in range(k + m) if i not in lost}
    np.testing.assert_array_equal(code.decode(kept, size), payload)
    cpu_shards = code.encode(payload)
    kept_torch = {i: torch.from_numpy(cpu_shards[i].copy()).to(device) for i in kept}
    np.testing.assert_array_equal(codec_torch.decode(code, kept_torch, size).cpu().numpy(), payload)


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(1, 12),
    m=st.integers(0, 5),
    size=st.integers(0, 3000),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_matches_numpy(k: int, m: int, size: int, seed: int) -> None:
    code = ReedSolomon(k, m)
    payload = _payload(size, seed)
    shards = code.encode(payload)
    data = np.stack(shards[:k])
    parity = codec_torch.encode_parity(code, torch.from_numpy(data))
    np.testing.assert_array_equal(parity.numpy(), _reference_parity(code, data))
    rng = np.random.default_rng(seed)
    kept = sorted(rng.choice(k + m, size=k, replace=False).tolist())
    result = codec_torch.decode(code, {i: torch.from_numpy(shards[i].copy()) for i in kept}, size)
    np.testing.assert_array_equal(result.numpy(), payload)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_errors(device: str) -> None:
    code = ReedSolomon(4, 2)
    size = 1000
    shards = [torch.from_numpy(s.copy()).to(device) for s in code.encode(_payload(size))]
    with pytest.raises(InsufficientShardsError) as info:
        codec_torch.decode(code, {i: shards[i] for i in (0, 2, 5)}, size)
    assert info.value.details == {"needed": 4, "available": 3}
    with pytest.raises(InsufficientShardsError):
        codec_torch.decode(code, {}, size)
    uneven = {0: shards[0], 1: shards[1], 2: shards[2], 4: shards[4][:-1]}
    with pytest.raises(ShardMismatchError):
        codec_torch.decode(code, uneven, size)
    kept = {i: shards[i] for i in (1, 2, 3, 4)}
    with pytest.raises(ShardMismatchError):
        codec_torch.decode(code, kept, size + 4)  # shards too short for that payload
    with pytest.raises(ValueError):
        codec_torch.decode(code, {**kept, 6: shards[0]}, size)
    with pytest.raises(TypeError):
        codec_torch.decode(code, {**kept, 1: shards[1].to(torch.int16)}, size)


def test_encode_errors() -> None:
    code = ReedSolomon(4, 2)
    data = torch.zeros((4, 16), dtype=torch.uint8)
    with pytest.raises(ShardMismatchError):
        codec_torch.encode_parity(code, torch.zeros((3, 16), dtype=torch.uint8))
    with pytest.raises(ShardMismatchError):
        codec_torch.encode_parity(code, torch.zeros(64, dtype=torch.uint8))
    with pytest.raises(TypeError):
        codec_torch.encode_parity(code, data.to(torch.int32))
    with pytest.raises(ShardMismatchError):
        codec_torch.encode_parity(code, data, out=torch.empty((2, 15), dtype=torch.uint8))
    with pytest.raises(TypeError):
        codec_torch.encode_parity(code, data, out=torch.empty((2, 16), dtype=torch.float32))
