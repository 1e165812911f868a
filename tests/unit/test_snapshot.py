"""The no-pickle snapshot format: states round-trip bit-exact; bad input raises the specific errors."""

from __future__ import annotations

import collections
import contextlib
import gc
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.exact_states import assert_tree_exact

from ray_ckpt import settings as settings_knobs
from ray_ckpt.core import snapshot as snap
from ray_ckpt.errors import SnapshotFormatError, UnsupportedLeafError

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

DTYPE_NAMES = list(snap.DTYPES)


def make_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """A contiguous tensor of random bit patterns (0/1 for bool)."""
    if 0 in shape:
        return torch.empty(shape, dtype=dtype)
    count = math.prod(shape) * dtype.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, count, dtype=np.uint8)
    if dtype == torch.bool:
        raw %= 2
    return torch.from_numpy(raw).view(dtype).reshape(shape)


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    if tensor.numel() == 0:
        return b""
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(expected: Any, actual: Any, path: str = "state") -> None:
    """Equal structure, exact types, key order, tensor dtype/shape/bytes and float bits."""
    assert_tree_exact(expected, actual, _same_type_and_tensor, path)


def _same_type_and_tensor(expected: Any, actual: Any, path: str) -> bool:
    """The exact type (a Parameter comes back a plain tensor); a tensor's dtype, shape and bytes,
    on the CPU and without grad."""
    assert type(actual) is type(expected) or (type(expected) is torch.nn.Parameter and type(actual) is torch.Tensor), (
        f"{path}: {type(expected).__name__} came back as {type(actual).__name__}"
    )
    if not isinstance(expected, torch.Tensor):
        return False
    assert actual.dtype == expected.dtype, path
    assert actual.shape == expected.shape, path
    assert actual.device.type == "cpu" and not actual.requires_grad, path
    assert tensor_bytes(actual) == tensor_bytes(expected), path
    return True


def round_trip(state: Any, **kwargs: Any) -> Any:
    header, payload = snap.snapshot(state)
    return snap.restore(header, payload, **kwargs)


# ---- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DTYPE_NAMES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (1,), (5, 7)])
def test_every_dtype_and_shape_round_trips_bit_exact(name: str, shape: tuple[int, ...]) -> None:
    """Each supported dtype, 0-dim, empty and 2-D, comes back with the same bytes, dtype and shape."""
    tensor = make_tensor(snap.DTYPES[name], shape, seed=len(shape))
    restored = round_trip({"t": tensor})["t"]
    assert_same(tensor, restored)
    assert restored.is_contiguous()


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_non_contiguous_views_round_trip_bit_exact(name: str) -> None:
    """Transposed and step-sliced views are stored as their logical (contiguous) content."""
    base = make_tensor(snap.DTYPES[name], (6, 8), seed=1)
    views = {"t": base.t(), "step": base[::2, 1::3], "col": base[:, 5], "neg": base[1:, ::4].t()}
    assert not all(v.is_contiguous() for v in views.values())
    assert_same(views, round_trip(views))


def test_bfloat16_bool_and_complex_values_are_preserved() -> None:
    """Readable values of the dtypes that need byte-view tricks survive exactly."""
    state = {
        "bf16": torch.tensor([1.5, -0.0, float("inf"), float("nan")], dtype=torch.bfloat16),
        "bool": torch.tensor([[True, False], [False, True]]),
        "c64": torch.tensor([1 + 2j, -3.5j], dtype=torch.complex64),
        "c128": torch.tensor([[1e300 - 1j]], dtype=torch.complex128).t(),
        "conj": torch.tensor([1 + 2j], dtype=torch.complex64).conj(),
    }
    restored = round_trip(state)
    assert_same({**state, "conj": state["conj"].resolve_conj()}, restored)
    assert torch.equal(restored["bool"], state["bool"])
    assert restored["conj"].item() == 1 - 2j


def test_nested_structure_keeps_key_types_order_and_container_types() -> None:
    """Int and str keys in insertion order, OrderedDict/dict, tuple/list and plain leaves keep types."""
    state = {
        "b": {3: "three", "3": b"three", -1: None, 0: [1, (2, [3])]},
        1: collections.OrderedDict([("z", 1), ("a", 2)]),
        "a": (
            None,
            True,
            False,
            0,
            -(2**63),
            2**64 - 1,
            1.5,
            -0.0,
            math.inf,
            -math.inf,
            math.nan,
            "",
            "ünïcødé ✓",
            b"",
            b"\x00\xff",
        ),
        "empty": [{}, [], (), collections.OrderedDict()],
        "mixed": [torch.arange(3), {"x": (torch.ones(2, dtype=torch.float64), 7)}],
    }
    restored = round_trip(state)
    assert_same(state, restored)
    assert list(restored) == ["b", 1, "a", "empty", "mixed"]


def test_plain_value_and_bare_tensor_states() -> None:
    """The whole state may be a single leaf."""
    assert round_trip(None) is None
    assert round_trip("x") == "x"
    tensor = torch.arange(6).reshape(2, 3)
    assert_same(tensor, round_trip(tensor))


def test_tensor_appearing_twice_is_stored_once_and_restored_shared() -> None:
    """Tied weights: one tensor object referenced twice occupies the payload once and stays shared."""
    weight = torch.randn(16, 4)
    state = {"embed": weight, "head": weight, "other": weight.clone()}
    layout = snap.build_layout(state)
    assert len(layout.tensors) == 2
    restored = round_trip(state)
    assert restored["embed"] is restored["head"]
    assert restored["embed"] is not restored["other"]
    assert_same(state, restored)


def test_views_sharing_storage_are_saved_apart_and_restored_as_independent_tensors() -> None:
    """As the format documents: ``a`` and ``a[10:20]`` (and a state_dict's tied weights, one
    detached tensor per name) are two tensors: each saved with its own bytes, restored with the
    right values but no longer sharing storage."""
    base = torch.arange(40, dtype=torch.float32)
    model = torch.nn.Sequential(torch.nn.Embedding(4, 3), torch.nn.Linear(3, 4, bias=False))
    model[1].weight = model[0].weight
    state = {"a": base, "view": base[10:20], "t": base.view(4, 10).t(), "tied": model.state_dict()}
    assert len(snap.build_layout(state).tensors) == 5
    restored = round_trip(state)
    assert_same(state, restored)
    restored["a"][10] = -1.0
    assert restored["view"][0] == 10.0 and restored["t"][0, 1] == 10.0
    tied = restored["tied"]
    assert tied["0.weight"].data_ptr() != tied["1.weight"].data_ptr()


def test_requires_grad_tensors_and_parameters_store_data_only() -> None:
    """Autograd leaves and Parameters come back as plain tensors with their data."""
    param = torch.nn.Parameter(torch.randn(3, 3))
    computed = param * 2
    restored = round_trip({"p": param, "c": computed})
    assert type(restored["p"]) is torch.Tensor and not restored["p"].requires_grad
    assert torch.equal(restored["p"], param.detach())
    assert torch.equal(restored["c"], computed.detach())


def test_linear_and_adam_state_dicts_load_into_fresh_objects() -> None:
    """A Linear and an Adam after one step restore into fresh objects that train identically."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    data = torch.randn(8, 5)

    def step(m: torch.nn.Module, o: torch.optim.Optimizer) -> None:
        o.zero_grad()
        m(data).square().sum().backward()
        o.step()

    step(model, optim)
    state = {"model": model.state_dict(), "optim": optim.state_dict(), "epoch": 1}
    restored = round_trip(state)
    assert_same(state, restored)
    assert list(restored["optim"]["state"]) == [0, 1]

    fresh_model = torch.nn.Linear(5, 3)
    fresh_optim = torch.optim.Adam(fresh_model.parameters(), lr=0.5)
    fresh_model.load_state_dict(restored["model"])
    fresh_optim.load_state_dict(restored["optim"])
    step(model, optim)
    step(fresh_model, fresh_optim)
    for p, q in zip(model.parameters(), fresh_model.parameters()):
        assert torch.equal(p, q)


def test_copy_true_tensors_own_memory_and_copy_false_views_the_payload() -> None:
    """copy=True survives the payload being overwritten; copy=False tensors above
    OWN_MEMORY_BYTES alias it, smaller ones own their memory."""
    large = snap.OWN_MEMORY_BYTES // 4 + 1
    state = {"w": torch.arange(large, dtype=torch.float32), "small": torch.arange(32, dtype=torch.float32)}
    header, payload = snap.snapshot(state)
    owned = snap.restore(header, payload)
    viewed = snap.restore(header, payload, copy=False)
    payload[:] = 0
    assert torch.equal(owned["w"], state["w"]) and torch.equal(owned["small"], state["small"])
    assert torch.count_nonzero(viewed["w"]) == 0
    assert torch.equal(viewed["small"], state["small"])
    assert viewed["small"].untyped_storage().nbytes() == viewed["small"].nbytes
    with pytest.raises(ValueError, match="writable"):
        snap.restore(header, payload.tobytes(), copy=False)


def test_a_restored_rng_state_can_be_set_back_in_torch() -> None:
    """torch.set_rng_state reads a tensor's storage from its start: a restored generator state
    (5056 bytes, after other tensors in the payload) owns its memory, so setting it back gives
    the saved generator (a view at an offset crashed the process)."""
    torch.manual_seed(3)
    state = {"weights": torch.randn(4096), "rng": torch.get_rng_state()}
    expected = torch.rand(8)
    header, payload = snap.snapshot(state)
    restored = snap.restore(header, payload, copy=False)
    assert restored["rng"].storage_offset() == 0
    torch.set_rng_state(restored["rng"])
    assert torch.equal(torch.rand(8), expected)


@pytest.mark.parametrize("kind", ["numpy", "tensor", "bytes", "bytearray"])
def test_restore_accepts_payload_buffer_kinds_and_extra_tail(kind: str) -> None:
    """numpy, torch, bytes and bytearray payloads work, also longer than payload_size (shard padding)."""
    state = {"a": torch.randn(3, 5), "b": [torch.ones(2, dtype=torch.int16)]}
    header, payload = snap.snapshot(state)
    padded = np.concatenate([payload, np.full(100, 7, dtype=np.uint8)])
    buffers = {
        "numpy": padded,
        "tensor": torch.from_numpy(padded),
        "bytes": padded.tobytes(),
        "bytearray": bytearray(padded.tobytes()),
    }
    assert_same(state, snap.restore(header, buffers[kind]))


def test_write_payload_into_torch_tensor_at_odd_storage_offset() -> None:
    """A uint8 tensor slice at an odd storage offset is a valid output buffer."""
    state = {"x": torch.randn(7, 3, dtype=torch.float64).t(), "y": torch.randn(5)}
    layout = snap.build_layout(state)
    big = torch.full((layout.payload_size + 3,), 0xAB, dtype=torch.uint8)
    out = big[3:]
    snap.write_payload(layout, out)
    assert_same(state, snap.restore(layout.header, out))
    _, reference = snap.snapshot(state)
    assert out.numpy().tobytes() == reference.tobytes()


def test_write_payload_rejects_small_or_read_only_buffers() -> None:
    """Too-small, read-only and device-less outputs raise ValueError before copying anything."""
    layout = snap.build_layout({"x": torch.randn(100)})
    with pytest.raises(ValueError, match="needs"):
        snap.write_payload(layout, np.empty(layout.payload_size - 1, dtype=np.uint8))
    read_only = np.empty(layout.payload_size, dtype=np.uint8)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        snap.write_payload(layout, read_only)
    with pytest.raises(ValueError, match="writable"):
        snap.write_payload(layout, bytes(layout.payload_size))


# ---- layout and determinism -------------------------------------------------------------------


def test_offsets_are_aligned_and_header_describes_the_layout() -> None:
    """Tensor offsets are multiples of 64 and the header records dtype, shape, offset, nbytes."""
    state = {
        "a": torch.ones(3, dtype=torch.int8),
        "b": torch.ones(5, 2),
        "c": torch.empty(0),
        "d": torch.ones(1),
    }
    layout = snap.build_layout(state)
    assert all(o % snap.ALIGNMENT == 0 for o in layout.offsets)
    meta = msgpack.unpackb(layout.header, raw=False, strict_map_key=False)
    assert meta["magic"] == snap.MAGIC and meta["version"] == 1  # no DTensor: readable by older ray_ckpt
    assert meta["tensors"] == [
        ["int8", [3], 0, 3],
        ["float32", [5, 2], 64, 40],
        ["float32", [0], 0, 0],
        ["float32", [1], 128, 4],
    ]
    assert meta["payload_size"] == layout.payload_size == 132


def test_same_state_gives_identical_bytes_with_zeroed_padding() -> None:
    """Two snapshots of equal states are byte-identical, even when `out` held garbage."""

    def build() -> dict[Any, Any]:
        return {
            "a": torch.ones(3, dtype=torch.int8),
            "b": [torch.arange(10.0).reshape(2, 5).t()],
            2: (1.0, "x"),
        }

    header1, payload1 = snap.snapshot(build())
    layout = snap.build_layout(build())
    garbage = np.full(layout.payload_size, 0xFF, dtype=np.uint8)
    snap.write_payload(layout, garbage)
    assert layout.header == header1
    assert garbage.tobytes() == payload1.tobytes()
    assert not payload1[3:64].any()


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_parallel_copy_writes_the_same_bytes_as_one_thread(threads: int) -> None:
    """Spans split across tensor boundaries, whole non-contiguous/conj/neg tensors and tiny
    tensors all land at their offsets; the gaps stay zeroed."""
    state = {
        "big": make_tensor(torch.float32, (1000, 37), seed=1),
        "view": make_tensor(torch.float64, (40, 30), seed=2).t(),
        "conj": make_tensor(torch.complex64, (50,), seed=3).conj(),
        "neg": torch._neg_view(make_tensor(torch.float32, (33,), seed=4)),
        "flags": make_tensor(torch.bool, (101,), seed=5),
        "scalar": torch.tensor(2.5, dtype=torch.bfloat16),
        "empty": torch.empty(0, 3),
        "tail": make_tensor(torch.int16, (4099,), seed=6),
    }
    layout = snap.build_layout(state)
    with settings_knobs.override(RAY_CKPT_COPY_THREADS=1):
        expected = np.full(layout.payload_size, 0xAB, dtype=np.uint8)
        snap.write_payload(layout, expected)
    with settings_knobs.override(RAY_CKPT_COPY_THREADS=threads, RAY_CKPT_COPY_PARALLEL_MIN_BYTES=0):
        parallel = np.full(layout.payload_size, 0xCD, dtype=np.uint8)
        snap.write_payload(layout, parallel)
    assert parallel.tobytes() == expected.tobytes()
    restored = snap.restore(layout.header, parallel)
    for key, tensor in state.items():
        assert tensor_bytes(restored[key]) == tensor_bytes(tensor.resolve_conj().resolve_neg()), key


def test_build_layout_references_tensors_without_copying() -> None:
    """build_layout keeps detached references to the source tensors (same storage), copying no data."""
    tensor = torch.randn(4, 4, requires_grad=True)
    layout = snap.build_layout({"t": tensor})
    assert layout.tensors[0].data_ptr() == tensor.data_ptr()
    assert not layout.tensors[0].requires_grad


# ---- unsupported leaves -----------------------------------------------------------------------


class Point(NamedTuple):
    x: int
    y: int


UNSUPPORTED: list[tuple[Callable[[], Any], str, str]] = [
    (lambda: {"model": {"w": np.zeros(3, dtype=object)}}, "state['model']['w']", "dtype object"),
    (lambda: {"w": np.zeros(snap.MAX_ARRAY_BYTES // 8 + 1)}, "state['w']", "torch.from_numpy"),
    (lambda: {"m": np.ma.masked_array([1, 2])}, "state['m']", "np.asarray"),
    (lambda: {"rec": np.zeros(2, dtype=[("a", "i4")])}, "state['rec']", "convert it to a list"),
    (lambda: {"optim": {"state": {3: {"exp_avg": {1, 2}}}}}, "state['optim']['state'][3]['exp_avg']", "set"),
    (lambda: {"a": [0, object()]}, "state['a'][1]", "object"),
    (lambda: {"a": {1.5: 2}}, "state['a']", "dict key 1.5"),
    (lambda: {"a": {(1, 2): 2}}, "state['a']", "keys must be str or int"),
    (lambda: {"p": Point(1, 2)}, "state['p']", "tuple subclass Point"),
    (lambda: {"s": np.str_("x")}, "state['s']", ".item()"),
    (lambda: {"big": {2**64: 1}}, "state['big']", "64-bit"),
    (lambda: {"g": torch.Generator()}, "state['g']", "get_state()"),
    (lambda: {"g": np.random.default_rng(0)}, "state['g']", "bit_generator.state"),
    (lambda: {"b": bytearray(b"x")}, "state['b']", "bytes()"),
    (lambda: {"o": collections.Counter()}, "state['o']", "dict"),
    (lambda: {"f": Point}, "state['f']", "state_dict()"),
    (lambda: {"d": collections.defaultdict(int)}, "state['d']", "convert it to a dict"),
    (lambda: {"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)}, "state['q']", "qint8"),
    (lambda: {"m": torch.empty(2, device="meta")}, "state['m']", "meta"),
    (lambda: {"sp": torch.eye(2).to_sparse()}, "state['sp']", "sparse"),
    (lambda: {"u": "\ud800"}, "state['u']", "UTF-8"),
]


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
@pytest.mark.parametrize(("make_state", "path", "words"), UNSUPPORTED, ids=[c[1] for c in UNSUPPORTED])
def test_unsupported_leaf_names_its_key_path(make_state: Callable[[], Any], path: str, words: str) -> None:
    """Each unsupported leaf or key raises UnsupportedLeafError naming the path and what is supported."""
    with pytest.raises(UnsupportedLeafError) as info:
        snap.build_layout(make_state())
    assert info.value.details["key_path"] == path
    assert path in str(info.value) and words in str(info.value)
    assert "torch tensors" in str(info.value)


def test_garbage_collector_is_re_enabled_after_errors() -> None:
    """build_layout and restore pause the cyclic GC only while they run, also when they raise."""
    assert gc.isenabled()
    with pytest.raises(UnsupportedLeafError):
        snap.build_layout({"x": {1, 2}})
    with pytest.raises(SnapshotFormatError):
        snap.restore(b"\xc1", b"")
    assert gc.isenabled()


def test_reference_cycle_is_refused_not_infinite() -> None:
    """A list that contains itself raises UnsupportedLeafError instead of recursing forever."""
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(UnsupportedLeafError, match="nested deeper"):
        snap.build_layout({"loop": loop})


# ---- malformed input --------------------------------------------------------------------------


def _valid() -> tuple[dict[str, Any], np.ndarray]:
    header, payload = snap.snapshot({"w": torch.randn(4, 3), "n": [1, "x"], "e": torch.empty(0)})
    return msgpack.unpackb(header, raw=False, strict_map_key=False), payload


def _pack(meta: Any) -> bytes:
    return msgpack.packb(meta, use_bin_type=True)


def _with(**changes: Any) -> bytes:
    meta, _ = _valid()
    meta.update(changes)
    return _pack(meta)


def _with_tensor(index: int, value: Any) -> bytes:
    meta, _ = _valid()
    meta["tensors"][0][index] = value
    return _pack(meta)


def _deep(levels: int) -> list[Any]:
    node: list[Any] = ["v", 1]
    for _ in range(levels):
        node = ["l", [node]]
    return node


MALFORMED_HEADERS = {
    "empty": b"",
    "random bytes": bytes(range(7, 90, 3)),
    "truncated": _pack(_valid()[0])[:-5],
    "trailing bytes": _pack(_valid()[0]) + b"\x00",
    "not a map": _pack([1, 2, 3]),
    "wrong magic": _with(magic="pickle"),
    "no version": _with(version=None),
    "future version": _with(version=snap.FORMAT_VERSION + 1),
    "negative payload size": _with(payload_size=-1),
    "payload size too small": _with(payload_size=10),
    "tensors not a list": _with(tensors={"a": 1}),
    "offset past end": _with_tensor(2, 1 << 20),
    "unaligned offset": _with_tensor(2, 4),
    "negative shape": _with_tensor(1, [-4, -3]),
    "float shape": _with_tensor(1, [4.0, 3]),
    "huge shape": _with_tensor(1, [2**62, 2**62, 0]),
    "unknown dtype": _with_tensor(0, "float128"),
    "dtype not str": _with_tensor(0, ["float32"]),
    "nbytes mismatch": _with_tensor(3, 47),
    "short descriptor": _with(tensors=[["float32", [4, 3], 0]]),
    "no tree": _pack({k: v for k, v in _valid()[0].items() if k != "tree"}),
    "unknown tag": _with(tree=["x", []]),
    "tensor index out of range": _with(tree=["T", 3]),
    "negative tensor index": _with(tree=["T", -1]),
    "bad dict entry": _with(tree=["d", [["k"]]]),
    "float dict key": _with(tree=["d", [[1.5, ["v", 1]]]]),
    "value is a container": _with(tree=["v", [1, 2]]),
    "ext type value": _with(tree=["v", msgpack.ExtType(5, b"x")]),
    "too deep": _with(tree=_deep(snap.MAX_DEPTH + 2)),
}


@pytest.mark.parametrize("case", list(MALFORMED_HEADERS))
def test_malformed_header_raises_snapshot_format_error(case: str) -> None:
    """Every kind of broken header raises SnapshotFormatError, never another exception."""
    _, payload = _valid()
    with pytest.raises(SnapshotFormatError):
        snap.restore(MALFORMED_HEADERS[case], payload)


def test_future_version_message_says_to_upgrade() -> None:
    """A newer format version names both versions and says to upgrade."""
    _, payload = _valid()
    with pytest.raises(SnapshotFormatError, match="upgrade") as info:
        snap.restore(MALFORMED_HEADERS["future version"], payload)
    assert info.value.details["version"] == snap.FORMAT_VERSION + 1


def test_truncated_payload_raises_snapshot_format_error() -> None:
    """A payload shorter than payload_size raises SnapshotFormatError with both sizes."""
    meta, payload = _valid()
    with pytest.raises(SnapshotFormatError, match="truncated") as info:
        snap.restore(_pack(meta), payload[:-1])
    assert info.value.details == {"payload_size": payload.size, "received": payload.size - 1}


def test_non_buffer_arguments_raise_type_error() -> None:
    """A header or payload that is not a buffer at all is a TypeError (a caller bug)."""
    header, payload = snap.snapshot({"x": 1})
    with pytest.raises(TypeError):
        snap.restore("header", payload)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        snap.restore(header, [1, 2, 3])


def _restore_or_format_error(header: bytes, payload: Any) -> None:
    with contextlib.suppress(SnapshotFormatError):
        snap.restore(header, payload)


@settings(max_examples=300, deadline=None)
@given(header=st.binary(max_size=200), payload=st.binary(max_size=300))
def test_random_bytes_never_raise_another_exception(header: bytes, payload: bytes) -> None:
    """Property: random header bytes either restore or raise SnapshotFormatError."""
    _restore_or_format_error(header, payload)


def _msgpack_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=3)


_MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.sampled_from([0, 1, 3, 4, 64, 63, -1, 2**62, 2**63])
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["v", "T", "d", "o", "l", "t", "float32", "bool", snap.MAGIC])
    | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8,
)


def _mutate(node: Any, data: st.DataObject) -> Any:
    if isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = data.draw(st.sampled_from(keys))
        if data.draw(st.integers(0, 9)) == 0:
            del node[key]
        else:
            node[key] = _mutate(node[key], data)
        return node
    return data.draw(_MSGPACK_VALUES)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_headers_never_raise_another_exception(data: st.DataObject) -> None:
    """Property: a header with a random field replaced or removed restores or raises SnapshotFormatError."""
    meta, payload = _valid()
    _restore_or_format_error(_pack(_mutate(meta, data)), payload)


@settings(max_examples=200, deadline=None)
@given(position=st.integers(0, 10_000), value=st.integers(0, 255), cut=st.integers(0, 10_000))
def test_flipped_or_cut_header_bytes_never_raise_another_exception(position: int, value: int, cut: int) -> None:
    """Property: a header with one byte changed, maybe truncated, restores or raises SnapshotFormatError."""
    meta, payload = _valid()
    header = bytearray(_pack(meta))
    header[position % len(header)] = value
    _restore_or_format_error(bytes(header[: max(cut, len(header) // 2)]), payload)


# ---- random states ----------------------------------------------------------------------------


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = snap.DTYPES[draw(st.sampled_from(DTYPE_NAMES))]
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    tensor = make_tensor(dtype, shape, seed=draw(st.integers(0, 2**16)))
    if len(shape) >= 2 and draw(st.booleans()):
        tensor = tensor.transpose(0, 1)
    return tensor


_KEYS = st.text(max_size=5) | st.integers(-(2**63), 2**64 - 1)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(_KEYS, children, max_size=4)
        | st.dictionaries(_KEYS, children, max_size=4).map(collections.OrderedDict)
    )


_STATES = st.recursive(
    tensors()
    | st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=10)
    | st.binary(max_size=10),
    _containers,
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=_STATES)
def test_random_nested_states_round_trip(state: Any) -> None:
    """Property: random nested states of tensors and plain values round-trip exactly, deterministically."""
    header, payload = snap.snapshot(state)
    assert_same(state, snap.restore(header, payload))
    header2, payload2 = snap.snapshot(state)
    assert header2 == header and payload2.tobytes() == payload.tobytes()


_BAD_LEAVES = st.sampled_from(
    [
        lambda: {1, 2},
        lambda: np.zeros(2, dtype=object),
        lambda: object(),
        lambda: Point(1, 2),
        lambda: {2**64: "big key"},
        lambda: collections.defaultdict(list),
        lambda: {(1, 2): "tuple key"},
    ]
)


@settings(max_examples=150, deadline=None)
@given(state=_STATES, steps=st.lists(_KEYS, min_size=1, max_size=4), bad=_BAD_LEAVES)
def test_an_unsupported_leaf_anywhere_is_refused_naming_its_path(state: Any, steps: list[Any], bad: Any) -> None:
    """Property: one unsupported value put at a random key path in a valid state fails at
    build_layout time with UnsupportedLeafError, and the message names that path."""
    tree: dict[Any, Any] = {"ok": state}
    node = tree
    for key in steps[:-1]:
        node[key] = {}
        node = node[key]
    node[steps[-1]] = bad()
    path = "state" + "".join(f"[{key!r}]" for key in steps)
    with pytest.raises(UnsupportedLeafError) as raised:
        snap.build_layout(tree)
    assert str(raised.value).startswith(path) or path in str(raised.value)
