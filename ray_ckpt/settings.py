"""Every environment-variable knob of ray_ckpt, its default, and an override for tests.

Each knob is read when used (not at import), so ``override`` and a changed environment take
effect at once. Knobs tune mechanics; what a job checkpoints is set in ``CheckpointConfig``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_overrides: dict[str, str] = {}


def _read(name: str, default: T, parse: Callable[[str], T]) -> T:
    raw = _overrides.get(name, os.environ.get(name))
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a valid value") from None


def namespace() -> str:
    """RAY_CKPT_NAMESPACE: the Ray namespace holding the store and registry actors."""
    return _read("RAY_CKPT_NAMESPACE", "ray_ckpt", str)


def codec_threads() -> int:
    """RAY_CKPT_CODEC_THREADS: threads the codec uses for large payloads (default: all cores, up to 4)."""
    return max(1, _read("RAY_CKPT_CODEC_THREADS", min(4, os.cpu_count() or 1), int))


def codec_parallel_min_bytes() -> int:
    """RAY_CKPT_CODEC_PARALLEL_MIN_BYTES: below this many bytes touched, the codec stays on one thread."""
    return _read("RAY_CKPT_CODEC_PARALLEL_MIN_BYTES", 8 << 20, int)


def copy_threads() -> int:
    """RAY_CKPT_COPY_THREADS: threads that copy CPU tensors into the host buffer during the
    blocking part of a save (default: all cores, up to 4; the training loop is paused then)."""
    return max(1, _read("RAY_CKPT_COPY_THREADS", min(4, os.cpu_count() or 1), int))


def copy_parallel_min_bytes() -> int:
    """RAY_CKPT_COPY_PARALLEL_MIN_BYTES: below this many bytes of CPU tensors, a save copies on one thread."""
    return _read("RAY_CKPT_COPY_PARALLEL_MIN_BYTES", 16 << 20, int)


def peer_timeout_s() -> float:
    """RAY_CKPT_PEER_TIMEOUT_S: how long one call to a store or the registry may take."""
    return _read("RAY_CKPT_PEER_TIMEOUT_S", 30.0, float)


def store_budget_fraction() -> float:
    """RAY_CKPT_STORE_BUDGET_FRACTION: share of a node's total memory a store may hold, when
    ``ray_ckpt.start`` is given no explicit budget."""
    return _read("RAY_CKPT_STORE_BUDGET_FRACTION", 0.25, float)


def node_memory_ceiling() -> float:
    """RAY_CKPT_NODE_MEMORY_CEILING: a store refuses to allocate a shard when its node's memory
    in use would pass this fraction of the total (Ray's memory monitor acts at 0.95)."""
    ceiling = _read("RAY_CKPT_NODE_MEMORY_CEILING", 0.9, float)
    if not 0 < ceiling <= 1:
        raise ValueError(f"RAY_CKPT_NODE_MEMORY_CEILING must be in (0, 1], got {ceiling}")
    return ceiling


def store_job_fraction() -> float | None:
    """RAY_CKPT_STORE_JOB_FRACTION: share of a store's budget one job may hold there (its
    shards, local copies and their metadata). ``fair`` (the default, returned as None): the
    budget divided by the jobs holding shards there, all of it for a job alone; a job's
    superseded steps give way first and its newest committed step is never evicted for another
    job (``ray_ckpt.core.job_share``). A number in (0, 1]: that fixed share (1: no per-job
    limit, one job may fill a store). Read by each store at start."""
    fraction = _read("RAY_CKPT_STORE_JOB_FRACTION", None, _fair_or_float)
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"RAY_CKPT_STORE_JOB_FRACTION must be fair or in (0, 1], got {fraction}")
    return fraction


def _fair_or_float(raw: str) -> float | None:
    return None if raw.strip().lower() == "fair" else float(raw)


def save_event_every() -> int:
    """RAY_CKPT_SAVE_EVENT_EVERY: send a save event to the registry every N saves (the first
    save after a restore always sends one)."""
    return max(1, _read("RAY_CKPT_SAVE_EVENT_EVERY", 10, int))


def event_max_bytes() -> int:
    """RAY_CKPT_EVENT_MAX_BYTES: the largest event (its JSON) the registry accepts from a caller
    (``RegistryActor.record``); a larger one is refused and not recorded."""
    return max(1, _read("RAY_CKPT_EVENT_MAX_BYTES", 64 << 10, int))


def events_file_max_bytes() -> int:
    """RAY_CKPT_EVENTS_FILE_MAX_BYTES: the registry's events file is rotated (renamed to
    ``<file>.1``) before a line would take it past this size."""
    return max(1, _read("RAY_CKPT_EVENTS_FILE_MAX_BYTES", 64 << 20, int))


def events_file_keep() -> int:
    """RAY_CKPT_EVENTS_FILE_KEEP: rotated events files kept (``<file>.1`` the newest, up to
    ``<file>.N``); 0 keeps none."""
    return max(0, _read("RAY_CKPT_EVENTS_FILE_KEEP", 2, int))


def events_memory_max_bytes() -> int:
    """RAY_CKPT_EVENTS_MEMORY_MAX_BYTES: the registry keeps its newest events in memory up to
    this many bytes of their JSON (for ``registry.events()``, the live dashboard); as Python
    objects they take a few times that."""
    return max(1, _read("RAY_CKPT_EVENTS_MEMORY_MAX_BYTES", 16 << 20, int))


def dashboard_events_max_bytes() -> int:
    """RAY_CKPT_DASHBOARD_EVENTS_MAX_BYTES: a running ``ray-ckpt dashboard`` holds its events up
    to this many bytes of their JSON (as Python objects a few times that); past it, it drops the
    oldest down to three quarters of it (``ray_ckpt.dashboard.data.EventWindow``)."""
    return max(1, _read("RAY_CKPT_DASHBOARD_EVENTS_MAX_BYTES", 32 << 20, int))


def dashboard_events_max_age_s() -> float:
    """RAY_CKPT_DASHBOARD_EVENTS_MAX_AGE_S: a running ``ray-ckpt dashboard`` drops events older
    than this against its newest one (or the clock, if earlier), down to three quarters of it."""
    return _positive_seconds("RAY_CKPT_DASHBOARD_EVENTS_MAX_AGE_S", 86400.0)


def store_watch_interval_s() -> float:
    """RAY_CKPT_STORE_WATCH_INTERVAL_S: how often the registry looks for alive nodes without a
    store and starts one there (a node that joins or rejoins gets its store by itself); 0 turns
    the watch off."""
    return max(0.0, _read("RAY_CKPT_STORE_WATCH_INTERVAL_S", 2.0, float))


def relay_fanin() -> int:
    """RAY_CKPT_RELAY_FANIN: children per store in the relay tree that carries stages to the
    registry (``ray_ckpt.core.relay``), as the registry draws it; the registry takes a few calls
    per step, from the root, however many stores there are."""
    return max(1, _read("RAY_CKPT_RELAY_FANIN", 16, int))


def relay_linger_s() -> float:
    """RAY_CKPT_RELAY_LINGER_S: how long the root of the relay tree waits for more stages before
    it calls the registry (fewer, larger calls; each commit is that much later)."""
    return max(0.0, _read("RAY_CKPT_RELAY_LINGER_S", 0.005, float))


def relay_timeout_s() -> float:
    """RAY_CKPT_RELAY_TIMEOUT_S: how long a store waits for its parent in the relay tree before
    it stages with the registry itself."""
    return _read("RAY_CKPT_RELAY_TIMEOUT_S", 5.0, float)


def inplace_max_recoveries() -> int:
    """RAY_CKPT_INPLACE_MAX_RECOVERIES: in-place recoveries one worker process of an
    ``InPlaceRecovery`` run makes; its next lost-peer error goes to Ray Train (a failure that
    counts in ``max_failures``) instead. 0: every failure goes to Ray Train."""
    return max(0, _read("RAY_CKPT_INPLACE_MAX_RECOVERIES", 100, int))


def direct_writes() -> bool:
    """RAY_CKPT_DIRECT_WRITES: saves write each shard into its store over the store's socket
    (``direct_reads.write``) rather than through Ray's object store (a ``ray.put`` and a store
    call); 0 turns it off (the path to compare against, or for networks that allow only Ray's own
    ports). Off whatever it says when direct reads are off (RAY_CKPT_DIRECT_READS=0, or TLS):
    stores then serve no socket. Read by savers as they save."""
    return direct_reads() and _read(
        "RAY_CKPT_DIRECT_WRITES", True, lambda raw: raw.strip().lower() not in ("0", "false", "no", "off")
    )


def direct_reads() -> bool:
    """RAY_CKPT_DIRECT_READS: restores read shards and byte ranges from each store over a
    plain TCP connection (``ray_ckpt.transport.direct_reads``) rather than through Ray's object store;
    0 turns it off (for networks that allow only Ray's own ports). Off whatever it says when
    Ray runs with TLS (RAY_USE_TLS): the port is not encrypted, so reads go through Ray's. Read
    by stores as they start and by readers as they read."""
    if os.environ.get("RAY_USE_TLS", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    return _read("RAY_CKPT_DIRECT_READS", True, lambda raw: raw.strip().lower() not in ("0", "false", "no", "off"))


def _positive_seconds(name: str, default: float) -> float:
    value = _read(name, default, float)
    if not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value}")
    return value


def prefetch_max_bytes() -> int:
    """RAY_CKPT_PREFETCH_MAX_BYTES: the most bytes of state a replacement worker holds read
    ahead of its restores (``ray_ckpt.prefetch``) before they claim it; past it the oldest read
    is dropped (its restore reads for itself). Default: a quarter of this node's memory."""
    return max(0, _read("RAY_CKPT_PREFETCH_MAX_BYTES", _node_memory_bytes() // 4, int))


def prefetch_max_age_s() -> float:
    """RAY_CKPT_PREFETCH_MAX_AGE_S: how long a replacement worker holds a state it read ahead of
    its restores (``ray_ckpt.prefetch``) for a restore to claim; then it is dropped."""
    return _positive_seconds("RAY_CKPT_PREFETCH_MAX_AGE_S", 600.0)


def _node_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says
        return 16 << 30


def auto_mtbf_s() -> float:
    """RAY_CKPT_AUTO_MTBF_S: the mean time between failures ``every="auto"`` assumes for a job
    until it has seen one (or for as long as the job has run without one, if that is longer)."""
    return _positive_seconds("RAY_CKPT_AUTO_MTBF_S", 3600.0)


def auto_max_interval_s() -> float:
    """RAY_CKPT_AUTO_MAX_INTERVAL_S: the longest stretch of training ``every="auto"`` leaves
    without a save (its interval is capped at the power of two of steps that fits), unless the
    background work of one save takes longer than that."""
    return _positive_seconds("RAY_CKPT_AUTO_MAX_INTERVAL_S", 600.0)


@contextlib.contextmanager
def override(**values: object) -> Iterator[None]:
    """Temporarily set knobs by env-var name, e.g. ``override(RAY_CKPT_CODEC_THREADS=1)``."""
    saved = dict(_overrides)
    _overrides.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)
