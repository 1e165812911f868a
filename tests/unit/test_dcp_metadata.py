"""DCP's Metadata as ray_ckpt's msgpack (``ray_ckpt.integrations.dcp_metadata``): the Metadata of
a real ``dcp.save`` (a model, Adam's state, bytes entries, non-tensor leaves) comes back equal,
index hints included, and equal to what DCP's FileSystemWriter writes; every malformed payload
(a pickle, an unknown tag, a field of the wrong type, ...) is a DcpMetadataError; what the
encoding cannot hold fails the save; the encoding covers every field of DCP's classes."""

from __future__ import annotations

import dataclasses
import pathlib
import pickle
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import torch
import torch.distributed.checkpoint as dcp
from support.dcp_peers import FolderPeers
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ray_ckpt.errors import ConfigError, DcpMetadataError, SnapshotFormatError
from ray_ckpt.integrations.dcp import PeerMemoryReader, PeerMemoryWriter
from ray_ckpt.integrations.dcp_metadata import decode_metadata, encode_metadata


@pytest.fixture(autouse=True)
def _no_single_process_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def trained_state() -> dict[str, Any]:
    """A small model and its Adam after one step (int keys in the optimizer's state), with
    non-tensor leaves DCP saves as bytes items and tensors of several dtypes and ranks."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).sum().backward()
    optim.step()
    return {
        "model": model.state_dict(),
        "optim": optim.state_dict(),
        "step": 7,
        "run": {"name": "trial-3", "lr_history": [1e-3, 5e-4], "betas": (0.9, 0.99), "note": None, "raw": b"\x00\x01"},
        "rng": torch.get_rng_state(),
        "half": torch.randn(3, 2).to(torch.bfloat16),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
    }


class RecordingWriter(PeerMemoryWriter):
    """Keeps the Metadata DCP hands to ``finish``, as ``finish`` completes it."""

    recorded: Metadata | None = None

    def finish(self, metadata: Metadata, results: Any) -> None:
        super().finish(metadata, results)
        self.recorded = metadata


def hints(metadata: Metadata) -> set[tuple[str, str, int | None]]:
    """Every storage index with its hint (MetadataIndex's equality leaves the hint out)."""
    return {(index.fqn, repr(index.offset), index.index) for index in metadata.storage_data}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, Metadata]:
    """A real dcp.save of ``trained_state`` into peer memory (step 7) and to disk."""
    folder = tmp_path_factory.mktemp("dcp-metadata")
    writer = RecordingWriter(FolderPeers(folder / "peers", 0, 1))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(trained_state(), storage_writer=writer, checkpoint_id=7)
        dcp.save(trained_state(), storage_writer=dcp.FileSystemWriter(str(folder / "disk")))
    assert writer.recorded is not None
    return folder, writer.recorded


def test_the_metadata_of_a_real_save_round_trips_and_equals_what_dcp_writes_to_disk(
    saved: tuple[pathlib.Path, Metadata],
) -> None:
    folder, metadata = saved
    kinds = {type(entry) for entry in metadata.state_dict_metadata.values()}
    assert kinds == {TensorStorageMetadata, BytesStorageMetadata}
    assert ("optim", "param_groups", 0, "betas") in metadata.planner_data.values()  # a list index in a path

    back = decode_metadata(encode_metadata(metadata), 7)
    assert back == metadata and hints(back) == hints(metadata)
    read = PeerMemoryReader(FolderPeers(folder / "peers", 0, 1)).read_metadata()  # what a load decodes
    assert read == metadata and hints(read) == hints(metadata)

    on_disk = dcp.FileSystemReader(str(folder / "disk")).read_metadata()
    assert read.state_dict_metadata == on_disk.state_dict_metadata
    assert read.planner_data == on_disk.planner_data


def test_the_step_loads_back_with_its_non_tensor_leaves(saved: tuple[pathlib.Path, Metadata]) -> None:
    folder, _ = saved
    expected = trained_state()
    optim = expected["optim"]
    target = {
        "model": {k: torch.zeros_like(v) for k, v in expected["model"].items()},
        "optim": {
            "state": {i: {k: torch.zeros_like(v) for k, v in moments.items()} for i, moments in optim["state"].items()},
            "param_groups": [{k: None for k in group} for group in optim["param_groups"]],
        },
        "step": None,
        "run": {k: None for k in expected["run"]},
        "rng": torch.zeros_like(expected["rng"]),
        "half": torch.zeros(3, 2, dtype=torch.bfloat16),
        "scalar": torch.tensor(0.0),
        "empty": torch.empty(0, 4),
    }
    dcp.load(target, storage_reader=PeerMemoryReader(FolderPeers(folder / "peers", 0, 1)))
    assert (target["step"], target["run"]) == (7, expected["run"])
    assert target["optim"]["param_groups"] == optim["param_groups"]
    assert type(target["run"]["betas"]) is tuple and type(target["run"]["raw"]) is bytes
    got = {**target["model"], **{f"{i}.{k}": v for i, m in target["optim"]["state"].items() for k, v in m.items()}}
    want = {**expected["model"], **{f"{i}.{k}": v for i, m in optim["state"].items() for k, v in m.items()}}
    assert sorted(k for k in want if torch.equal(got[k], want[k])) == sorted(want)
    assert all(torch.equal(target[k], expected[k]) for k in ("rng", "half", "scalar"))


def test_every_field_of_dcps_metadata_classes_is_encoded() -> None:
    """A torch that adds a field fails here, not by dropping it from saved steps."""
    fields = {
        cls.__name__: [field.name for field in dataclasses.fields(cls)]
        for cls in (Metadata, TensorStorageMetadata, TensorProperties, ChunkStorageMetadata, StorageMeta, MetadataIndex)
    }
    assert fields == {
        "Metadata": ["state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"],
        "TensorStorageMetadata": ["properties", "size", "chunks"],
        "TensorProperties": ["dtype", "layout", "requires_grad", "memory_format", "pin_memory"],
        "ChunkStorageMetadata": ["offsets", "sizes"],
        "StorageMeta": ["checkpoint_id", "save_id", "load_id", "modules"],
        "MetadataIndex": ["fqn", "offset", "index"],
    }
    assert dataclasses.fields(BytesStorageMetadata) == ()


def first(body: dict[str, Any], kind: str) -> list[Any]:
    """The first state_dict_metadata entry of ``kind`` ("tensor" or "bytes")."""
    return next(entry for _, entry in body["state_dict_metadata"] if entry[0] == kind)


def set_at(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        node: Any = body
        for key in path[:-1]:
            node = first(body, key) if key in ("tensor", "bytes") else node[key]
        node[path[-1]] = value

    return mutate


def duplicate_first_entry(body: dict[str, Any]) -> None:
    body["state_dict_metadata"].append(body["state_dict_metadata"][0])


MALFORMED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "another format": set_at(("format",), "ray_ckpt.snapshot"),
    "a newer version": set_at(("version",), 2),
    "a bool for the version": set_at(("version",), True),
    "an unknown field": set_at(("extra",), 1),
    "an unknown entry tag": set_at(("tensor", 0), "sparse"),
    "a bytes entry with fields": lambda body: first(body, "bytes").append(3),
    "a size that is not a list": set_at(("tensor", 2), "6x5"),
    "a negative size": set_at(("tensor", 2), [-1, 5]),
    "an unknown dtype": set_at(("tensor", 1), "float128"),
    "an int for requires_grad": lambda body: first(body, "tensor")[4].__setitem__(1, 1),
    "a chunk outside its tensor": lambda body: first(body, "tensor")[3][0].__setitem__(1, [10**6] * 2),
    "a float in a key path": lambda body: body["planner_data"][0].__setitem__(1, ["model", 1.5]),
    "a span of another step": lambda body: body["storage_data"][0][1].__setitem__(0, 8),
    "a span whose bytes do not fit its shape": lambda body: body["storage_data"][0][1].__setitem__(4, 3),
    "a span key that is not a str": lambda body: body["storage_data"][0][1].__setitem__(2, 5),
    "a span of an fqn the metadata lacks": lambda body: body["storage_data"][0][0].__setitem__(0, "nowhere"),
    "an fqn twice": duplicate_first_entry,
    "a module that is not a str": set_at(("storage_meta", 3), [1]),
    "an ext type": set_at(("dcp_version",), msgpack.ExtType(1, b"x")),
}


@pytest.mark.parametrize("problem", MALFORMED, ids=str)
def test_a_malformed_metadata_payload_is_refused_naming_the_step(
    saved: tuple[pathlib.Path, Metadata], problem: str
) -> None:
    body = msgpack.unpackb(encode_metadata(saved[1]), raw=False)
    MALFORMED[problem](body)
    with pytest.raises(DcpMetadataError, match=r"^step 7's DCP metadata is malformed: ") as caught:
        decode_metadata(msgpack.packb(body, use_bin_type=True), 7)
    assert isinstance(caught.value, SnapshotFormatError) and caught.value.step == 7


NOT_THE_ENCODING: dict[str, Callable[[Metadata], bytes]] = {
    "empty": lambda _: b"",
    "not msgpack": lambda _: b"\xc1",
    "a msgpack list": lambda _: b"\x92\x01\x02",
    "truncated": lambda metadata: encode_metadata(metadata)[:-3],
    "DCP's own pickle of it": pickle.dumps,
}


@pytest.mark.parametrize("payload", NOT_THE_ENCODING, ids=str)
def test_bytes_that_are_not_the_encoding_are_refused(saved: tuple[pathlib.Path, Metadata], payload: str) -> None:
    with pytest.raises(DcpMetadataError, match="step 7's DCP metadata is malformed: the payload is not"):
        decode_metadata(NOT_THE_ENCODING[payload](saved[1]), 7)


def test_what_the_encoding_cannot_hold_fails_the_save() -> None:
    tensor = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([2]), [])
    with pytest.raises(ConfigError, match="planner_data"):
        encode_metadata(Metadata({"w": tensor}, planner_data={"w": ["w"]}, storage_data={}))
    with pytest.raises(ConfigError, match="planner_data"):
        encode_metadata(Metadata({"w": tensor}, planner_data=object(), storage_data={}))
    with pytest.raises(ConfigError, match="PeerSpan"):
        encode_metadata(Metadata({"w": tensor}, storage_data={MetadataIndex("w", [0]): "elsewhere"}))
    odd = TensorStorageMetadata(TensorProperties(dtype=torch.quint8), torch.Size([2]), [])
    with pytest.raises(ConfigError, match="dtype quint8"):
        encode_metadata(Metadata({"q": odd}, storage_data={}))
