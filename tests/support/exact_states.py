"""Bit-exact comparison of a restored state with the one saved: the same structure (key types,
keys and their order, lengths) and float bits all the way down; what a leaf must match (a
tensor's or an array's dtype, shape and bytes) is the caller's check."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

LeafCheck = Callable[[Any, Any, str], bool]
"""``check(expected, actual, path)``, called on every node first: it asserts what it knows of the
node (its type, say) and returns True for a leaf it checked whole."""


def assert_tree_exact(expected: Any, actual: Any, check: LeafCheck, path: str = "state") -> None:
    """``check`` first; then dicts by key types, keys and order, lists and tuples by length and
    item, floats by their bits, anything else by ``==``; ``path`` names the node in a failure."""
    if check(expected, actual, path):
        return
    if isinstance(expected, dict):
        assert [(type(k), k) for k in actual] == [(type(k), k) for k in expected], path
        for key in expected:
            assert_tree_exact(expected[key], actual[key], check, f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_tree_exact(e, a, check, f"{path}[{i}]")
    elif isinstance(expected, float):
        assert struct.pack("<d", actual) == struct.pack("<d", expected), path
    else:
        assert actual == expected, path
