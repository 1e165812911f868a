"""The torch.distributed internals ray_ckpt relies on, all in one place.

In-place recovery must abort every process group a worker holds when a peer is lost, not only
``dist.group.WORLD``: FSDP2, HSDP and tensor-parallel device meshes create subgroups, and an NCCL
collective on any of them hangs on a lost peer. torch has no public list of a process's groups;
its registry is ``torch.distributed.distributed_c10d._world.pg_names`` (group -> name, in order
of creation), and the NCCL backend's ``_group_start``/``_group_end`` bracket aborts so that
several communicators' aborts cannot deadlock each other (pytorch/pytorch#119797). Both are
internal, so every use is here; ``tests/unit/test_torch_compat.py`` fails when an upgrade moves
them. On a torch without them, ``process_groups`` falls back to WORLD alone and says so once.

gloo's sockets are told apart from the process's others by what gloo's TCP transport does to
each pair's socket (``is_gloo_pair``); ``tests/unit/test_gloo_connections.py`` checks it on real
gloo groups.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

TESTED_TORCH = ((2, 13), (2, 14))  # [from, to): the versions whose process-group registry was verified
_warned = False
_TIMEVAL = struct.Struct("@ll")  # struct timeval: seconds, microseconds


def tested() -> bool:
    """Whether this torch is in the range whose process-group registry was verified."""
    major, minor = torch.__version__.split(".")[:2]
    low, high = TESTED_TORCH
    return low <= (int(major), int(minor)) < high


def process_groups() -> list[Any]:
    """Every process group this process holds, oldest first (WORLD, then the subgroups in the
    order they were made); empty when none is initialized."""
    global _warned
    if not dist.is_initialized():
        return []
    registry = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_names", None)
    if isinstance(registry, dict):
        return list(registry)
    if not _warned:
        _warned = True
        low, high = TESTED_TORCH
        logger.warning(
            "torch %s has no process-group registry where ray_ckpt looks (verified for torch %d.%d to %d.%d): "
            "only the default group is aborted when a peer is lost",
            torch.__version__, *low, *high,
        )  # fmt: skip
    return [dist.group.WORLD]


@contextlib.contextmanager
def nccl_group(groups: list[Any]) -> Iterator[None]:
    """Bracket NCCL communicator calls in one ncclGroupStart/End when any of ``groups`` has an
    NCCL backend; otherwise do nothing."""
    backend = None
    if dist.is_nccl_available() and torch.cuda.is_available():
        for group in groups:
            try:
                candidate = group._get_backend(torch.device("cuda"))
            except (RuntimeError, AttributeError):
                continue
            if isinstance(candidate, dist.ProcessGroupNCCL):
                backend = candidate
                break
    if backend is None:
        yield
        return
    backend._group_start()
    try:
        yield
    finally:
        backend._group_end()


def is_gloo_pair(sock: socket.socket) -> bool:
    """Whether ``sock`` is the socket of a gloo pair (one peer connection of a gloo process
    group, either end): gloo's TCP transport sets its receive and send timeouts (``SO_RCVTIMEO``,
    ``SO_SNDTIMEO``) to the group's timeout, which a plain socket (Python's, a TCPStore's) leaves
    at zero. False for a socket whose options cannot be read."""
    try:
        receive = _TIMEVAL.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TIMEVAL.size))
        send = _TIMEVAL.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _TIMEVAL.size))
    except (OSError, struct.error):
        return False
    return any(receive) and any(send)
