"""Aborting every process group of a worker whose peer is lost.

NCCL collectives hang on a lost peer instead of failing, on every group the peer belongs to:
WORLD and the subgroups device meshes make (FSDP2's, HSDP's, tensor parallelism's). ``abort_all``
aborts them all, newest first (a mesh's subgroups before the group they were split from), NCCL
communicators inside one group call, so every collective and every queued NCCL kernel of this
process on them ends with an error instead of waiting for the peer. A group whose abort raises is
logged and the rest are still aborted. What the groups are comes from ``ray_ckpt.train._torch_compat``.
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
