"""The ray_ckpt exceptions: one base and one kind per recovery decision; all picklable."""

from __future__ import annotations

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


class ShardMismatchError(RayCkptError, ValueError):
    """Shards given to the codec disagree in number or length."""


class InsufficientShardsError(RayCkptError):
    """Fewer than k valid shards survive: the payload cannot be rebuilt from memory."""


class CorruptShardError(RayCkptError):
    """A shard's bytes do not match its checksum (treated as an erasure by restore)."""


class SnapshotFormatError(RayCkptError, ValueError):
    """A snapshot header or payload is malformed, truncated or of an unknown version."""


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


class StaleAttemptError(RayCkptError):
    """A worker of a replaced worker group tried to stage or restore; it must stop."""


class StoreUnavailableError(RayCkptError):
    """The ray_ckpt service is not running or a store could not be reached."""
