"""What a resumed run saves besides tensors: RNG states, data loader and LR scheduler state dicts,
numpy arrays and scalars, ints beyond 64 bits; each comes back exactly (same types, same
values, and the generators it comes from continue as they would have), older states keep their
bytes, and malformed version-3 nodes raise SnapshotFormatError."""

from __future__ import annotations

import collections
import contextlib
import random
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support.exact_states import assert_tree_exact

from ray_ckpt.core import snapshot as snap
from ray_ckpt.errors import SnapshotFormatError


def round_trip(state: Any, **kwargs: Any) -> Any:
    header, payload = snap.snapshot(state)
    return snap.restore(header, payload, **kwargs)


def version_of(state: Any) -> int:
    return int(msgpack.unpackb(snap.build_layout(state).header, raw=False, strict_map_key=False)["version"])


def assert_exact(expected: Any, actual: Any, path: str = "state") -> None:
    """Same types all the way down, same key order, numpy dtype (byte order included), shape and
    bytes, float bits, tensor dtype, shape and bytes."""
    assert_tree_exact(expected, actual, _same_type_and_bytes, path)


def _same_type_and_bytes(expected: Any, actual: Any, path: str) -> bool:
    """The exact type; a numpy array's or scalar's dtype (byte order included), shape and bytes;
    a tensor's dtype, shape and bytes."""
    assert type(actual) is type(expected), f"{path}: {type(expected).__name__} came back as {type(actual).__name__}"
    if isinstance(expected, np.ndarray):
        assert actual.dtype.str == expected.dtype.str and actual.shape == expected.shape, path
        assert actual.tobytes() == expected.tobytes(), path
    elif isinstance(expected, np.generic):
        assert actual.dtype.str == expected.dtype.str and actual.tobytes() == expected.tobytes(), path
    elif isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, path
        assert torch.equal(actual.view(torch.uint8), expected.view(torch.uint8)), path
    else:
        return False
    return True


# ---- RNG states: restored, the generator draws what it would have drawn -------------------------


def test_python_random_state_comes_back_as_tuples_and_resumes_the_draws() -> None:
    rng = random.Random(7)
    rng.random()
    state = rng.getstate()
    expected = [rng.random() for _ in range(5)]
    restored = round_trip({"python": state})["python"]
    assert_exact(state, restored)
    again = random.Random()
    again.setstate(restored)  # setstate refuses lists: the tuples must come back as tuples
    assert [again.random() for _ in range(5)] == expected


def test_numpy_legacy_state_holds_its_uint32_key_array_and_resumes_the_draws() -> None:
    legacy = np.random.RandomState(3)
    legacy.normal()  # a cached gaussian in the state
    state = legacy.get_state()
    assert isinstance(state, tuple) and state[1].dtype == np.uint32
    expected = legacy.random_sample(5)
    restored = round_trip(state)
    assert_exact(state, restored)
    again = np.random.RandomState()
    again.set_state(restored)
    assert again.random_sample(5).tobytes() == expected.tobytes()


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937,
                                           np.random.SFC64, np.random.Philox])  # fmt: skip
def test_numpy_generator_states_with_128_bit_ints_and_arrays_resume_the_draws(bit_generator: type) -> None:
    generator = np.random.Generator(bit_generator(11))
    generator.integers(0, 2**32, size=3)
    state = generator.bit_generator.state
    expected = generator.random(5)
    restored = round_trip({"numpy": state})["numpy"]
    assert_exact(state, restored)
    again = np.random.Generator(bit_generator())
    again.bit_generator.state = restored
    assert again.random(5).tobytes() == expected.tobytes()


def test_a_pcg64_state_needs_version_3_and_a_tensor_only_state_keeps_version_1() -> None:
    assert version_of({"numpy": np.random.default_rng(0).bit_generator.state}) == 3
    assert version_of({"torch": torch.get_rng_state(), "python": random.getstate()}) == 1


def test_torch_generator_state_resumes_the_draws() -> None:
    generator = torch.Generator().manual_seed(5)
    torch.randn(3, generator=generator)
    state = {"cpu": generator.get_state(), "cuda_like": [generator.get_state().clone()]}
    expected = torch.randn(4, generator=generator)
    restored = round_trip(state)
    assert_exact(state, restored)
    again = torch.Generator()
    again.set_state(restored["cpu"])
    assert torch.equal(torch.randn(4, generator=again), expected)


# ---- state dicts of schedulers and data loaders --------------------------------------------------


def _schedulers(optim: torch.optim.Optimizer) -> dict[str, Any]:
    sched = torch.optim.lr_scheduler
    return {
        "step": sched.StepLR(optim, step_size=2, gamma=0.5),
        "onecycle": sched.OneCycleLR(optim, max_lr=0.1, total_steps=20),
        "plateau": sched.ReduceLROnPlateau(optim),  # holds inf
        "warm_restarts": sched.CosineAnnealingWarmRestarts(optim, T_0=3),
        "sequential": sched.SequentialLR(
            optim, [sched.LinearLR(optim, total_iters=2), sched.ExponentialLR(optim, gamma=0.9)], milestones=[2]
        ),
    }


@pytest.mark.parametrize("name", ["step", "onecycle", "plateau", "warm_restarts", "sequential"])
def test_lr_scheduler_state_dicts_round_trip_and_load_into_a_fresh_scheduler(name: str) -> None:
    model = torch.nn.Linear(2, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = _schedulers(optim)[name]
    for _ in range(4):
        optim.step()
        scheduler.step(1.0) if name == "plateau" else scheduler.step()
    state = scheduler.state_dict()
    restored = round_trip({"scheduler": state})["scheduler"]
    assert_exact(state, restored)
    fresh_optim = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    fresh = _schedulers(fresh_optim)[name]
    fresh.load_state_dict(restored)
    assert fresh.state_dict() == state


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_stateful_dataloader_state_resumes_at_the_same_batch() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader(seed: int) -> Any:
        generator = torch.Generator().manual_seed(seed)
        return stateful.StatefulDataLoader(list(range(64)), batch_size=4, shuffle=True, generator=generator)

    first = loader(0)
    batches = iter(first)
    for _ in range(3):
        next(batches)
    state = first.state_dict()
    expected = [next(batches) for _ in range(3)]
    restored = round_trip({"loader": state})["loader"]
    assert_exact(state, restored)
    resumed = loader(99)  # another seed: the position and the order come from the state
    resumed.load_state_dict(restored)
    again = iter(resumed)
    assert all(torch.equal(next(again), batch) for batch in expected)


# ---- numpy values and big ints -----------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        np.arange(6, dtype=">u4").reshape(2, 3)[:, ::2],  # big-endian, non-contiguous
        np.array(5, dtype=np.int16),  # 0-d
        np.zeros((0, 3), dtype=np.float32),
        np.array(["ab", "c"]),
        np.array([b"x\x00", b""]),
        np.array([True, False]),
        np.array([1 + 2j], dtype=np.complex64),
        np.array(["2020-01-01T00:00"], dtype="datetime64[ns]"),
        np.array([3], dtype="timedelta64[s]"),
        np.float16(1.5),
        np.float32(np.nan),
        np.int8(-3),
        np.uint64(2**64 - 1),
        np.bool_(True),
        np.complex128(1j),
        np.datetime64("2021-02-03"),
        2**64,
        -(2**63) - 1,
        2**127 + 12345,
        -(2**1000),
    ],
    ids=repr,
)
def test_numpy_values_and_big_ints_come_back_as_the_same_type(value: Any) -> None:
    assert_exact({"v": value}, round_trip({"v": value}))
    assert version_of({"v": value}) == 3


@pytest.mark.parametrize("copy", [True, False])
def test_restored_arrays_are_writable_and_share_nothing_with_the_payload(copy: bool) -> None:
    saved = np.arange(4, dtype=np.int64)
    header, payload = snap.snapshot({"a": saved, "t": torch.ones(2)})
    restored = snap.restore(header, payload, copy=copy)["a"]
    restored[0] = 99
    assert saved[0] == 0 and restored.flags.writeable and restored.flags.owndata
    assert snap.restore(header, payload)["a"][0] == 0


def test_arrays_are_captured_when_the_layout_is_built() -> None:
    """Unlike tensor bytes (read at write_payload), an array's values are those of build_layout."""
    array = np.zeros(3)
    layout = snap.build_layout({"a": array})
    array[:] = 1
    payload = np.empty(layout.payload_size, dtype=np.uint8)
    snap.write_payload(layout, payload)
    assert snap.restore(layout.header, payload)["a"].tolist() == [0, 0, 0]


def test_read_layout_gives_the_arrays_themselves() -> None:
    """A reshard reads only headers: values, arrays included, are all there."""
    state = {"rng": np.random.get_state(), "w": torch.ones(3)}
    tree = snap.read_layout(snap.build_layout(state).header)
    assert_exact(state["rng"], tree["rng"])
    assert isinstance(tree["w"], snap.TensorRef)


# ---- compatibility ----------------------------------------------------------------------------

# The header the format wrote before numpy values and big ints were kept (version 1), for this
# state: the same bytes are still written, and read back.
_OLD_STATE_HEADER = bytes.fromhex(
    "85a56d61676963b67261795f636b70742e636f72652e736e617073686f74a776657273696f6e01ac7061796c6f61645f"
    "73697a6510a774656e736f72739194a5696e74333291040010a47472656592a1649792a47374657092a1760792a26c72"
    "92a16c9292a176cb3fe000000000000092a176cb3f647ae147ae147b92a3726e6792a1749392a1760392a1749292a176"
    "0192a176ceffffffff92a176c0920992a16f9192a17892a176c40200ff92a17492a1540092a26f6b92a176c392a17392"
    "a176a2c3a9"
)


def _old_state() -> dict[Any, Any]:
    return {
        "step": 7,
        "lr": [0.5, 2.5e-3],
        "rng": (3, (1, 2**32 - 1), None),
        9: collections.OrderedDict(x=b"\x00\xff"),
        "t": torch.arange(4, dtype=torch.int32),
        "ok": True,
        "s": "é",
    }


def test_a_state_without_new_values_is_written_byte_for_byte_as_before_and_read_back() -> None:
    header, payload = snap.snapshot(_old_state())
    assert header == _OLD_STATE_HEADER
    assert_exact(_old_state(), snap.restore(_OLD_STATE_HEADER, payload))


def test_a_reader_of_versions_1_and_2_refuses_version_3_saying_to_upgrade(monkeypatch: pytest.MonkeyPatch) -> None:
    header, payload = snap.snapshot({"rng": np.random.get_state()})
    monkeypatch.setattr(snap, "READ_VERSIONS", (1, 2))
    monkeypatch.setattr(snap, "FORMAT_VERSION", 2)
    with pytest.raises(SnapshotFormatError, match="version 3 \\(newer than this ray_ckpt; upgrade it\\)"):
        snap.restore(header, payload)


@pytest.mark.parametrize("version", [1, 2])
def test_version_3_nodes_in_an_older_header_are_refused(version: int) -> None:
    header, payload = snap.snapshot({"a": np.zeros(2)})
    meta = msgpack.unpackb(header, raw=False, strict_map_key=False)
    meta["version"] = version
    with pytest.raises(SnapshotFormatError, match="unknown node tag 'A'"):
        snap.restore(msgpack.packb(meta, use_bin_type=True), payload)


def _with_node(node: Any) -> bytes:
    meta = {"magic": snap.MAGIC, "version": 3, "payload_size": 0, "tensors": [], "tree": ["d", [["x", node]]]}
    return msgpack.packb(meta, use_bin_type=True)


MALFORMED: dict[str, Any] = {
    "int not bytes": ["I", 5],
    "int empty": ["I", b""],
    "array body not a list": ["A", b"\x00"],
    "array short body": ["A", ["<u4", [1]]],
    "array object dtype": ["A", ["|O", [1], b"\x00" * 8]],
    "array structured dtype": ["A", ["|V4", [1], b"\x00" * 4]],
    "array non-canonical dtype": ["A", ["uint32", [1], b"\x00" * 4]],
    "array garbage dtype": ["A", ["(*&^", [1], b"\x00"]],
    "array dtype not a str": ["A", [4, [1], b"\x00" * 4]],
    "array negative dim": ["A", ["<u4", [-1], b""]],
    "array shape not a list": ["A", ["<u4", 1, b"\x00" * 4]],
    "array too few bytes": ["A", ["<u4", [2], b"\x00" * 4]],
    "array huge empty shape": ["A", ["<u4", [0, 2**62, 2**62], b""]],
    "array bytes not bytes": ["A", ["<u4", [1], "abcd"]],
    "scalar wrong size": ["S", ["<f8", b"\x00" * 4]],
    "scalar str dtype": ["S", ["<U1", b"\x00" * 4]],
    "scalar body short": ["S", ["<f8"]],
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_version_3_nodes_raise_snapshot_format_error(case: str) -> None:
    with pytest.raises(SnapshotFormatError, match=r"state\['x'\]"):
        snap.restore(_with_node(MALFORMED[case]), b"")


# ---- property: nested plain values ------------------------------------------------------------

_KEYS = st.text(max_size=5) | st.integers(-(2**63), 2**64 - 1)
_ARRAY_DTYPES = (
    hnp.boolean_dtypes()
    | hnp.integer_dtypes(endianness="=")
    | hnp.unsigned_integer_dtypes(endianness="=")
    | hnp.floating_dtypes(endianness="=")
    | hnp.complex_number_dtypes(endianness="=")
    | hnp.integer_dtypes(endianness=">")
    | hnp.datetime64_dtypes()
    | hnp.unicode_string_dtypes(min_len=1, max_len=4)
    | hnp.byte_string_dtypes(min_len=1, max_len=4)
)
_ARRAYS = hnp.arrays(_ARRAY_DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
_SCALARS = (
    hnp.boolean_dtypes() | hnp.integer_dtypes() | hnp.unsigned_integer_dtypes() | hnp.floating_dtypes()
).flatmap(hnp.from_dtype)
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()  # any size: beyond 64 bits they are version-3 nodes
    | st.floats(allow_nan=True)
    | st.text(max_size=10)
    | st.binary(max_size=10)
    | _ARRAYS
    | _SCALARS
)
_PLAIN_STATES = st.recursive(
    _LEAVES,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(_KEYS, children, max_size=4)
        | st.dictionaries(_KEYS, children, max_size=4).map(collections.OrderedDict)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=_PLAIN_STATES)
def test_random_nested_plain_values_round_trip_exactly(state: Any) -> None:
    """Property: nested dicts, lists and tuples of plain values, ints of any size, numpy arrays
    and scalars come back with the same types, values and bytes, from the payload and from the
    header alone; the same state gives the same header."""
    header, payload = snap.snapshot(state)
    assert_exact(state, snap.restore(header, payload))
    assert_exact(state, snap.read_layout(header))
    assert snap.snapshot(state)[0] == header


@settings(max_examples=100, deadline=None)
@given(state=_PLAIN_STATES, data=st.data())
def test_mutated_version_3_headers_never_raise_another_exception(state: Any, data: st.DataObject) -> None:
    """Property: a valid header with one byte changed either reads or raises SnapshotFormatError."""
    header = bytearray(snap.snapshot(state)[0])
    position = data.draw(st.integers(0, len(header) - 1))
    header[position] = data.draw(st.integers(0, 255))
    with contextlib.suppress(SnapshotFormatError):
        snap.restore(bytes(header), np.zeros(1 << 12, dtype=np.uint8))


def test_every_unsupported_leaf_hint_names_a_conversion() -> None:
    """The refusals of objects a training loop may hold each say what to convert them to."""
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: {1, 2}, "sorted list"),
        (lambda: np.zeros(2, dtype=object), "convert it to a list"),
        (lambda: torch.Generator(), "get_state()"),
        (lambda: np.random.RandomState(0), "set_state()"),
        (lambda: torch.device("cpu"), "str()"),
        (lambda: object(), "state_dict()"),
    ]
    for make, words in cases:
        with pytest.raises(TypeError, match=r"state\['x'\]") as raised:
            snap.build_layout({"x": make()})
        assert words in str(raised.value)
