"""The GPU save's copy events, without a GPU: one event per device that holds a tensor, on that
device's current stream (where its device->host copy is queued), and the background waits for
every one of them before it encodes. torch.cuda's Event and current_stream are faked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from support.save_pipelines import lone_pipeline

from ray_ckpt.core import snapshot
from ray_ckpt.save import SavePipeline, record_copies


class FakeEvent:
    def __init__(self) -> None:
        self.stream: Any = "never recorded"
        self.synchronized = False

    def record(self, stream: Any = None) -> None:
        self.stream = stream

    def synchronize(self) -> None:
        self.synchronized = True


class FakeCuda:
    """The part of ``torch.cuda`` that records events: a stream is named by its device."""

    Event = FakeEvent

    @staticmethod
    def current_stream(device: Any = None) -> str:
        return f"current stream of cuda:{device}"


class FakeCudaTensor:
    """What ``record_copies`` and ``SavePipeline.snapshot`` look at of a CUDA tensor."""

    is_cuda = True

    def __init__(self, index: int) -> None:
        self.device = torch.device("cuda", index)


def pipeline() -> SavePipeline:
    return lone_pipeline("gpu", node_id="here", data_shards=2, parity_shards=1)


def test_one_event_per_device_on_that_devices_current_stream() -> None:
    tensors = [FakeCudaTensor(1), torch.ones(3), FakeCudaTensor(0), FakeCudaTensor(1)]
    events = record_copies(tensors, cuda=FakeCuda)  # type: ignore[arg-type]
    assert [event.stream for event in events] == ["current stream of cuda:0", "current stream of cuda:1"]
    assert record_copies([torch.ones(3)], cuda=FakeCuda) == []


def test_a_save_of_tensors_on_two_gpus_records_an_event_on_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """The blocking part of a save, its device->host copies faked: the events it hands to the
    background cover both devices' streams, not only the current device's."""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", FakeCuda.current_stream)
    monkeypatch.setattr(snapshot, "write_payload", lambda layout, out: None)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)
    saver = pipeline()
    saver._buffer = torch.zeros(1 << 12, dtype=torch.uint8)  # "pinned" already: nothing allocated
    layout = snapshot.SnapshotLayout(
        header=b"h", payload_size=64, tensors=[FakeCudaTensor(0), FakeCudaTensor(1)], offsets=[0, 0]
    )  # type: ignore[list-item]
    _, _, copied = saver.snapshot(layout)
    assert sorted(event.stream for event in copied) == ["current stream of cuda:0", "current stream of cuda:1"]


def test_the_background_waits_for_every_devices_copies_before_it_encodes() -> None:
    saver = pipeline()
    encoded: list[bool] = []
    events = [FakeEvent(), FakeEvent()]
    real_encode = saver.code.encode_parity

    def encode(data: list[np.ndarray], out: Any = None) -> list[np.ndarray]:
        encoded.append(all(event.synchronized for event in events))
        return real_encode(data, out)

    saver.code.encode_parity = encode  # type: ignore[method-assign]
    saver._scatter = lambda shards, metas, body, common: (["a", "b", "c"], None)  # type: ignore[method-assign]
    saver._stage = lambda request: True  # type: ignore[method-assign]
    buffer = np.zeros(128, dtype=np.uint8)
    assert saver.complete(1, buffer, 100, events, {}, 0.0)
    assert encoded == [True]
