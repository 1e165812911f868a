"""The record helpers in ray_ckpt.core: ``Forwarded`` reads through and refuses writes, and
``fields_dict`` gives a record's fields as fresh plain containers in declared order."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import pytest

from ray_ckpt.core.forwarded import Forwarded
from ray_ckpt.core.record_dict import fields_dict
from ray_ckpt.core.wire import StoreStats


@dataclasses.dataclass(frozen=True)
class _Inner:
    name: str


class _Holder:
    name = Forwarded[str]("inner")

    def __init__(self, inner: _Inner) -> None:
        self.inner = inner


def test_a_forwarded_attribute_reads_the_current_inner_value_and_cannot_be_assigned() -> None:
    holder = _Holder(_Inner("a"))
    assert holder.name == "a"
    holder.inner = _Inner("b")
    assert holder.name == "b"
    with pytest.raises(AttributeError, match=r"read-only: it is inner\.name"):
        holder.name = "c"
    assert isinstance(_Holder.name, Forwarded)


@dataclasses.dataclass(frozen=True)
class _Record:
    zeta: int
    nodes: tuple[str, ...]
    sizes: Mapping[str, int]
    names: list[str]


def test_fields_dict_keeps_declared_order_and_copies_containers_one_level() -> None:
    names = ["x"]
    record = _Record(zeta=1, nodes=("n1", "n2"), sizes=MappingProxyType({"a": 1}), names=names)
    values = fields_dict(record)
    assert list(values) == ["zeta", "nodes", "sizes", "names"]
    assert values == {"zeta": 1, "nodes": ["n1", "n2"], "sizes": {"a": 1}, "names": ["x"]}
    assert type(values["sizes"]) is dict and values["names"] is not names


def test_store_stats_as_dict_is_its_fields_with_jobs_as_a_dict() -> None:
    stats = StoreStats(
        node_id="n", budget_bytes=10, used_bytes=4, data_bytes=3, metadata_bytes=1, shards=2, jobs={"j": 4}
    )
    assert stats.as_dict() == {
        "node_id": "n",
        "budget_bytes": 10,
        "used_bytes": 4,
        "data_bytes": 3,
        "metadata_bytes": 1,
        "shards": 2,
        "jobs": {"j": 4},
    }
