"""The ray_ckpt exceptions: one base and one kind per recovery decision; all picklable.

``unwrap_remote`` turns the RayTaskError that carries a ray_ckpt error out of a Ray actor back
into that error. This module imports nothing but the standard library.
"""

from __future__ import annotations

import sys
from typing import Any


def _rebuild(cls: type[RayCkptError], message: str, details: dict[str, Any]) -> RayCkptError:
    return cls(message, **details)


class RayCkptError(Exception):
    """Base of every ray_ckpt error. ``details`` (also set as attributes) carry the step,
    ranks, shards or sizes involved, so callers can act on them without parsing text."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        for key, value in details.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.details))


class ConfigError(RayCkptError, ValueError):
    """A setting or argument is invalid; the message names it and the accepted values."""


class LayoutChangedError(ConfigError):
    """A DTensor is restored into another sharding than it was saved in (same global shape and
    dtype, another mesh, placements or block): a restore from peer memory reshards instead."""


class ShardMismatchError(RayCkptError, ValueError):
    """Shards given to the codec disagree in number or length."""


class InsufficientShardsError(RayCkptError):
    """Fewer than k valid shards survive: the payload cannot be rebuilt from memory."""


class ShardsUnreachableError(RayCkptError):
    """Too few shards answered in time, but enough may still exist: stores that are alive did
    not answer (paused, swapping, overloaded) or failed a call. Transient: the step is not given
    up and stays restorable; the next attempt reads it again. Only ``InsufficientShardsError``
    (fewer than k shards that exist and are intact) gives a step up."""


class CorruptShardError(RayCkptError):
    """A shard's bytes do not match its checksum (treated as an erasure by restore)."""


class SnapshotFormatError(RayCkptError, ValueError):
    """A snapshot header or payload is malformed, truncated or of an unknown version."""


class DcpMetadataError(SnapshotFormatError):
    """A DCP step's metadata in peer memory is malformed: not ray_ckpt's msgpack encoding of
    it, of an unknown version, or with an unknown type tag or a field of the wrong type
    (``ray_ckpt.integrations.dcp_metadata``). Nothing of it was unpickled; load another step."""


class UnsupportedLeafError(RayCkptError, TypeError):
    """A state leaf is neither a tensor nor msgpack-encodable; the message names its key path."""


class PlacementError(RayCkptError):
    """Too few nodes (or failure domains) to place k+m shards as configured."""


class StoreFullError(RayCkptError):
    """A store's memory budget would be exceeded; the message says how to raise it."""


class NoCheckpointError(RayCkptError):
    """The requested step was never committed, or was evicted."""


class CommitTimeoutError(RayCkptError):
    """Not every rank staged a step within the timeout; the message names the missing ranks."""


class TornStepError(RayCkptError):
    """A step can never commit: ranks that did not save it went past it (ranks on different
    intervals under ``every="auto"``, or a skip under ``on_busy="skip"``); no failure."""


class StaleAttemptError(RayCkptError):
    """A worker of a replaced worker group tried to stage or restore; it must stop."""


class StoreUnavailableError(RayCkptError):
    """The ray_ckpt service is not running or a store could not be reached."""


class KillError(RayCkptError, RuntimeError):
    """A kill could not be prepared or carried out (no crasher could be started on a node, or
    no raylet was found there); nothing was killed when it is raised while arming."""


class LabError(RayCkptError, RuntimeError):
    """The network lab (``ray_ckpt.tools.network_lab``) could not be built, changed or taken
    down; the message names the command that failed or what the machine lacks."""


class KillTimeoutError(KillError, TimeoutError):
    """A kill happened, but its victim (node or store) was not seen dead within the wait given."""


class InPlaceRecoveryError(RayCkptError, RuntimeError):
    """An in-place recovery could not complete (no replacement joined in time, or a full
    restart overtook it); Ray Train then restarts the worker group, which restores from peers."""


class CoordinatorTimeoutError(InPlaceRecoveryError, TimeoutError):
    """The run's generation coordinator did not answer a call within its bound
    (``ray_ckpt.transport.coordinator_client``); the message names the call and the bound. Like
    any InPlaceRecoveryError, Ray Train then restarts the worker group."""


class PeerLost(BaseException):
    """Raised into an in-place run's training function, between two of its Python operations,
    when a peer of its generation is lost (``InPlaceRecovery.wrap`` catches it and recovers).
    A ``BaseException``, like ``KeyboardInterrupt``, so that the function's ``except
    Exception`` blocks let it through; ``finally`` blocks and ``with`` exits run as usual.
    Never raised inside a ray_ckpt call: one in progress finishes first."""

    def __init__(self, message: str = "a peer of this generation is lost") -> None:
        super().__init__(message)


class HandedOver(PeerLost):
    """Raised by the Ray Train Checkpointer's ``save`` in a rank whose node drains, once a step
    saved after the drain notice committed: the rank has handed its place over (a replacement
    restores that step), and ``InPlaceRecovery.wrap`` ends its part. Like ``PeerLost``, a
    ``BaseException`` that the training function's ``except Exception`` blocks let through."""

    def __init__(self, message: str = "this rank's node drains; it handed its place over") -> None:
        super().__init__(message)


class CliError(RayCkptError):
    """A command-line failure, reported as one line on stderr (exit status 1)."""


class DashboardError(RayCkptError):
    """The dashboard cannot read its events or serve its page; the message says which and why."""


def unwrap_remote(error: BaseException) -> BaseException:
    """The ray_ckpt error a Ray task or actor raised, if ``error`` is the ``RayTaskError`` that
    carried it here (its ``cause``); else ``error`` unchanged. Use it where ray_ckpt calls its
    own actors: ``except Exception as e: raise unwrap_remote(e) from None``, so callers see
    ``NoCheckpointError`` with its details, not ``RayTaskError(NoCheckpointError)`` and a
    remote traceback."""
    exceptions = sys.modules.get("ray.exceptions")  # not loaded: no RayTaskError can exist
    if exceptions is None or not isinstance(error, exceptions.RayTaskError):
        return error
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, RayCkptError) else error
