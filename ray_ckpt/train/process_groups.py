"""Aborting every process group of a worker whose peer is lost.

NCCL collectives hang on a lost peer instead of failing, on every group the peer belongs to:
WORLD and the subgroups device meshes make (FSDP2's, HSDP's, tensor parallelism's). ``abort_all``
aborts them all, newest first (a mesh's subgroups before the group they were split from), NCCL
communicators inside one group call, so every collective and every queued NCCL kernel of this
process on them ends with an error instead of waiting for the peer. A group whose abort raises is
logged and the rest are still aborted. What the groups are comes from ``ray_ckpt.train._torch_compat``.

Whether there are NCCL communicators to abort is read per device type from the default group's
backend string (``uses_nccl``): ``"nccl"``, ``"cuda:nccl"`` and ``"cpu:gloo,cuda:nccl"`` (a group
with gloo for CPU tensors and NCCL for CUDA ones, which DCP's asynchronous save on GPUs needs)
have them, ``"gloo"`` has none. gloo's connections are shut whatever the backend
(``ray_ckpt.train.gloo_connections``: only gloo's own sockets, so none where no group runs gloo).
"""

from __future__ import annotations

import logging
from typing import Any

from ray_ckpt.train import _torch_compat

logger = logging.getLogger(__name__)


def abort_all() -> list[Any]:
    """Abort every process group this process holds (see the module docstring); returns them,
    in the order they were aborted. Safe to call with no process group (returns [])."""
    groups = list(reversed(_torch_compat.process_groups()))
    aborted = []
    with _torch_compat.nccl_group(groups):
        for group in groups:
            try:
                group.abort()
            except Exception as error:  # an already broken or shut group: the others still go
                logger.debug("aborting process group %s: %s", group, error)
                continue
            aborted.append(group)
    return aborted


def backends(backend: str) -> frozenset[str]:
    """The communication backends a process group's backend string (``dist.get_backend()``)
    names, whatever device each serves: ``"nccl"`` and ``"cuda:nccl"`` name NCCL,
    ``"cpu:gloo,cuda:nccl"`` gloo and NCCL. Case and spaces do not matter."""
    if not isinstance(backend, str):
        raise TypeError(f"a process group's backend is a string such as 'cpu:gloo,cuda:nccl', not {backend!r}")
    names = (part.rpartition(":")[2].strip().lower() for part in backend.split(","))
    return frozenset(name for name in names if name)


def uses_nccl(backend: str) -> bool:
    """Whether a process group of ``backend`` runs NCCL for some device (its collectives hang on
    a lost peer until its communicators are aborted)."""
    return "nccl" in backends(backend)
