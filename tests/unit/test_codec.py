"""The Reed-Solomon codec: any k of k+m shards rebuild the payload bit-exact."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_ckpt.core import _gf256, gf256
from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.errors import ConfigError, InsufficientShardsError, ShardMismatchError

SMALL_CODES = [(1, 0), (1, 1), (2, 1), (3, 2), (4, 2), (4, 1), (2, 4), (5, 3)]


def payload(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


@pytest.mark.parametrize(("k", "m"), SMALL_CODES)
@pytest.mark.parametrize("size", [0, 1, 5, 64, 1000, 4099])
def test_every_k_subset_decodes_bit_exact(k: int, m: int, size: int) -> None:
    """Exhaustive: each combination of k surviving shards rebuilds the payload."""
    code = ReedSolomon(k, m)
    data = payload(size)
    shards = code.encode(data)
    assert len(shards) == k + m
    assert {s.size for s in shards} == {code.shard_size(size)}
    for survivors in itertools.combinations(range(k + m), k):
        rebuilt = code.decode({i: shards[i] for i in survivors}, size)
        assert np.array_equal(rebuilt, data), survivors


@pytest.mark.parametrize(("k", "m"), [(4, 2), (3, 3), (6, 3)])
def test_losing_m_plus_one_shards_raises_the_specific_error(k: int, m: int) -> None:
    """With only k-1 shards left, decode raises InsufficientShardsError saying how many."""
    code = ReedSolomon(k, m)
    shards = code.encode(payload(999))
    survivors = {i: shards[i] for i in range(m + 1, k + m)}
    with pytest.raises(InsufficientShardsError, match=f"need {k} of {k + m} shards.*got {k - 1}") as info:
        code.decode(survivors, 999)
    assert info.value.needed == k and info.value.available == k - 1


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 12),
    m=st.integers(0, 6),
    size=st.integers(0, 3000),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_random_codes_sizes_and_erasures_decode(k: int, m: int, size: int, seed: int, data: st.DataObject) -> None:
    """Property: for drawn (k, m, size, erasure pattern), decode returns the payload."""
    code = ReedSolomon(k, m)
    original = payload(size, seed)
    shards = code.encode(original)
    lost = data.draw(st.sets(st.integers(0, k + m - 1), max_size=m))
    rebuilt = code.decode({i: s for i, s in enumerate(shards) if i not in lost}, size)
    assert np.array_equal(rebuilt, original)


def test_parity_1_is_plain_xor() -> None:
    """m = 1 parity is the XOR of the data shards."""
    code = ReedSolomon(5, 1)
    shards = code.encode(payload(5000))
    expected = np.bitwise_xor.reduce(np.stack(shards[:5]), axis=0)
    assert np.array_equal(shards[5], expected)


def test_zero_parity_is_a_split() -> None:
    """m = 0: the shards are the payload's slices and nothing else."""
    code = ReedSolomon(3, 0)
    data = payload(9)
    assert [s.tolist() for s in code.encode(data)] == [
        data[0:3].tolist(),
        data[3:6].tolist(),
        data[6:9].tolist(),
    ]


def test_data_shards_are_views_of_the_payload() -> None:
    """Systematic and zero-copy: whole data shards share memory with the payload."""
    code = ReedSolomon(4, 2)
    data = payload(4000)
    shards = code.encode(data)
    assert all(np.shares_memory(shards[i], data) for i in range(4))


def test_compiled_kernel_matches_the_reference_arithmetic() -> None:
    """The SIMD kernel's parity equals the table-driven reference on odd lengths."""
    code = ReedSolomon(7, 4)
    shards = code.split(payload(7 * 333 + 5))
    expected = [np.empty_like(shards[0]) for _ in range(4)]
    gf256.dot_numpy(code.parity_matrix, shards, expected, 0, shards[0].size)
    assert all(np.array_equal(a, b) for a, b in zip(code.encode_parity(shards), expected))


@pytest.mark.parametrize("kernel", _gf256.kernels())
@pytest.mark.parametrize("rows, cols", [(1, 4), (2, 4), (3, 6), (5, 8), (4, 10), (7, 5)])  # every group size
def test_every_kernel_this_cpu_runs_matches_the_reference_on_any_range(kernel: str, rows: int, cols: int) -> None:
    """Each SIMD kernel (the shuffle ones, the GFNI affine ones where the CPU has GFNI) against
    the table-driven reference: random coefficients with 0 and 1 among them, ranges that start
    off alignment and end in a tail shorter than a vector."""
    rng = np.random.default_rng(rows * 100 + cols)
    coefficients = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    coefficients[0, 0], coefficients[-1, -1] = 1, 0
    best = _gf256.isa()
    try:
        _gf256.use(kernel)
        for start, stop in [(0, 0), (3, 3 + 127), (5, 5 + 4096 + 77), (0, 128 * 9)]:
            inputs = [rng.integers(0, 256, stop + 8, dtype=np.uint8) for _ in range(cols)]
            got = [np.zeros(stop + 8, dtype=np.uint8) for _ in range(rows)]
            expected = [np.zeros(stop + 8, dtype=np.uint8) for _ in range(rows)]
            _gf256.dot(coefficients.tobytes(), rows, cols, inputs, got, start, stop)
            gf256.dot_numpy(coefficients, inputs, expected, start, stop)
            assert all(np.array_equal(a, b) for a, b in zip(got, expected)), (start, stop)
    finally:
        _gf256.use(best)


def test_a_kernel_this_cpu_does_not_run_is_refused() -> None:
    with pytest.raises(ValueError, match="does not run the kernel"):
        _gf256.use("quantum")
    assert _gf256.kernels()[0] == "scalar" and _gf256.isa() == _gf256.kernels()[-1]


def test_threaded_encode_and_decode_match_single_thread() -> None:
    """Splitting the work across threads changes no byte."""
    data = payload(3 << 20)
    single = ReedSolomon(4, 2, threads=1)
    multi = ReedSolomon(4, 2, threads=3)
    from ray_ckpt import settings as knobs

    with knobs.override(RAY_CKPT_CODEC_PARALLEL_MIN_BYTES=1):
        a, b = single.encode(data), multi.encode(data)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        rebuilt = multi.decode({i: a[i] for i in (2, 3, 4, 5)}, data.size)
    assert np.array_equal(rebuilt, data)


def test_numpy_bytes_memoryview_and_torch_inputs_agree() -> None:
    """Every accepted buffer type yields the same shards."""
    code = ReedSolomon(4, 2)
    data = payload(1234)
    reference = code.encode(data)
    floats = torch.from_numpy(data[:1232].copy()).view(torch.float32)
    for variant in (
        data.tobytes(),
        bytearray(data.tobytes()),
        memoryview(data.tobytes()),
        torch.from_numpy(data),
    ):
        assert all(np.array_equal(a, b) for a, b in zip(code.encode(variant), reference))
    assert all(np.array_equal(a, b) for a, b in zip(code.encode(floats), code.encode(data[:1232]))), (
        "a float tensor is coded as its raw bytes"
    )


def test_encode_parity_into_caller_buffers() -> None:
    """Parity lands in the caller's buffers (the allocation-free hot path)."""
    code = ReedSolomon(4, 2)
    data = code.split(payload(4096))
    out = [np.full(1024, 7, dtype=np.uint8) for _ in range(2)]
    returned = code.encode_parity(data, out)
    assert all(r is o or np.shares_memory(r, o) for r, o in zip(returned, out))
    assert all(np.array_equal(a, b) for a, b in zip(out, code.encode(payload(4096))[4:]))


def test_reconstruct_rebuilds_lost_data_and_parity() -> None:
    """reconstruct returns exactly the lost shards, data and parity alike."""
    code = ReedSolomon(4, 3)
    shards = code.encode(payload(5000))
    survivors = {i: shards[i] for i in (0, 2, 5, 6)}
    rebuilt = code.reconstruct(survivors, [1, 3, 4])
    assert sorted(rebuilt) == [1, 3, 4]
    assert all(np.array_equal(rebuilt[i], shards[i]) for i in rebuilt)


def test_verify_detects_a_flipped_byte() -> None:
    """verify is True on fresh shards and False after one byte changes."""
    code = ReedSolomon(3, 2)
    shards = [s.copy() for s in code.encode(payload(300))]
    assert code.verify(shards)
    shards[1][17] ^= 0x40
    assert not code.verify(shards)


def test_mismatched_shard_lengths_are_a_clear_error() -> None:
    """Shards of different lengths raise ShardMismatchError naming the lengths."""
    code = ReedSolomon(2, 1)
    with pytest.raises(ShardMismatchError, match=r"same length.*\[3, 4\]"):
        code.decode({0: np.zeros(3, np.uint8), 1: np.zeros(4, np.uint8)}, 6)


def test_wrong_payload_size_for_the_shards_is_a_clear_error() -> None:
    """A size that does not fit the shard length is refused, not silently truncated."""
    code = ReedSolomon(2, 1)
    shards = code.encode(payload(10))
    with pytest.raises(ShardMismatchError, match="payload size recorded"):
        code.decode({0: shards[0], 1: shards[1]}, 30)


@pytest.mark.parametrize(
    ("k", "m", "match"),
    [(0, 1, "data_shards"), (1, -1, "parity_shards"), (200, 57, "exceeds 256"), (True, 1, "data_shards")],
)
def test_invalid_parameters_raise_config_error(k: int, m: int, match: str) -> None:
    """Invalid (k, m) fail at construction with a message naming the parameter."""
    with pytest.raises(ConfigError, match=match):
        ReedSolomon(k, m)


def test_largest_code_decodes() -> None:
    """k + m = 256 is allowed and still MDS at its edge."""
    code = ReedSolomon(200, 56)
    data = payload(200 * 3)
    shards = code.encode(data)
    assert np.array_equal(code.decode({i: shards[i] for i in range(56, 256)}, data.size), data)


def test_non_contiguous_input_is_refused() -> None:
    """A strided array gets a clear error instead of a silent copy."""
    with pytest.raises(ValueError, match="C-contiguous"):
        ReedSolomon(2, 1).encode(payload(100)[::2])


def test_errors_survive_pickling() -> None:
    """Errors cross Ray process boundaries with their details."""
    error = InsufficientShardsError("lost", needed=4, available=2, rank=1)
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is InsufficientShardsError
    assert (clone.message, clone.needed, clone.available, clone.rank) == ("lost", 4, 2, 1)
