"""``fields_dict``: a frozen record's fields as a plain dict (what JSON and msgpack take)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def fields_dict(record: DataclassInstance) -> dict[str, Any]:
    """``record``'s fields by name, in their declared order, one level deep: a mapping becomes
    a new ``dict`` and a tuple or list a new ``list``; every other value is kept as it is (a nested record is
    not converted: a record that holds one writes its own dict)."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if isinstance(value, Mapping):
            value = dict(value)
        elif isinstance(value, (tuple, list)):
            value = list(value)
        values[field.name] = value
    return values
