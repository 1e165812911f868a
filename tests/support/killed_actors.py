"""Waiting for ``ray.kill`` to take effect: it returns at once, and a call may still get in first."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray

from support import pace


def wait_until_dead(call: Callable[[], Any], what: str, timeout_s: float = 30.0) -> None:
    """Call ``call()`` (one call to the killed actor, returning its ObjectRef) until it raises
    RayActorError; AssertionError naming ``what`` if the actor still answers after
    ``pace.bound(timeout_s)``."""
    deadline = time.monotonic() + pace.bound(timeout_s)
    while True:
        try:
            ray.get(call(), timeout=pace.bound(timeout_s))
        except ray.exceptions.RayActorError:
            return
        assert time.monotonic() < deadline, f"{what} still answers"
        time.sleep(0.1)
