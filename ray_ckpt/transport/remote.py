"""Calling ray_ckpt's own actors: ``ray.get`` that hands ray_ckpt's errors back as themselves."""

from __future__ import annotations

from typing import Any

import ray

from ray_ckpt.errors import unwrap_remote


def get(refs: Any, *, timeout: float | None) -> Any:
    """``ray.get(refs, timeout=timeout)``, except that a RayCkptError the actor raised is raised
    here as itself (``NoCheckpointError``, not ``RayTaskError(NoCheckpointError)``); every other
    error is raised as ``ray.get`` raises it."""
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.RayTaskError as error:
        own = unwrap_remote(error)
        if own is error:
            raise
        raise own from None
