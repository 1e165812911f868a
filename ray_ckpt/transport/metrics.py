"""Ray metrics of ray_ckpt (exported by Ray at each node's metrics export port, for Prometheus).

Ray prefixes every name with ``ray_``: ``ckpt_save_blocking_seconds`` is scraped as
``ray_ckpt_save_blocking_seconds_bucket`` / ``_sum`` / ``_count``; a counter is exported with
a ``_total`` suffix (the names below already end with it). Every series carries a
``ckpt_job`` (the ray_ckpt job name) and/or ``node_id`` tag; Ray adds ``SessionName``,
``NodeAddress``, ``WorkerId``, ... The job tag is not called ``job``: Prometheus sets ``job``
on every scraped series to its scrape job's name (``ray`` in Ray's config) and would rename
ours to ``exported_job``.

Ray drops a gauge from its export some 20-30 s after its last ``set``; every gauge set here
is therefore set again every ``GAUGE_REFRESH_S`` seconds by a daemon thread of the process.

Who records what:

- the registry actor: every event it logs (``observe_event``: save and restore phases,
  steps lost, kills, node deaths, and per recovery the time to resume and its phases, from
  ``ray_ckpt.core.timeline``), and on every commit the committed step and its protection
  (``observe_committed``);
- each store actor: its bytes, shards and budget after every change (``observe_store``);
- a rank writing a persistent backup: ``observe_backup``.

Save events are sampled (the first save of an attempt and every RAY_CKPT_SAVE_EVENT_EVERY-th),
so the save histograms describe those saves. Metrics are created lazily, once per process,
and never raise into their callers: a failure is logged at debug level and dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from ray_ckpt.core import timeline
from ray_ckpt.core.protection import step_protection
from ray_ckpt.core.wire import RankRecord, StoreStats

logger = logging.getLogger(__name__)

SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
RESUME_BUCKETS = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0)
STEPS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0)


@dataclasses.dataclass(frozen=True)
class MetricDef:
    """One metric: its name (without Ray's ``ray_`` prefix), kind, help text and tag keys."""

    name: str
    kind: str  # "counter" | "gauge" | "histogram"
    description: str
    tags: tuple[str, ...]
    boundaries: tuple[float, ...] = ()


DEFINITIONS: tuple[MetricDef, ...] = (
    # saves (sampled: see the module doc)
    MetricDef(
        "ckpt_save_blocking_seconds",
        "histogram",
        "Time save() blocked the training loop (waiting for the previous save + snapshot copy).",
        ("ckpt_job", "node_id"),
        SECONDS_BUCKETS,
    ),
    MetricDef(
        "ckpt_save_phase_seconds",
        "histogram",
        "Duration of each save phase: wait_previous, snapshot, blocking (caller), encode, scatter, stage, "
        "backup (background).",
        ("ckpt_job", "node_id", "phase"),
        SECONDS_BUCKETS,
    ),
    MetricDef("ckpt_save_bytes", "gauge", "Blob size of the newest recorded save of a rank.", ("ckpt_job", "node_id")),
    MetricDef(
        "ckpt_save_interval_steps",
        "gauge",
        'The save interval every="auto" chose last, in steps (the newest choice of any rank of the job).',
        ("ckpt_job",),
    ),
    MetricDef(
        "ckpt_backups_total", "counter", "Persistent backups written (one per rank and step).", ("ckpt_job", "node_id")
    ),
    MetricDef("ckpt_backup_bytes_total", "counter", "Bytes written to persistent backups.", ("ckpt_job", "node_id")),
    # restores and recoveries
    MetricDef(
        "ckpt_restore_phase_seconds",
        "histogram",
        "Duration of each restore phase of one rank: locate, fetch, decode, load.",
        ("ckpt_job", "node_id", "phase"),
        SECONDS_BUCKETS,
    ),
    MetricDef(
        "ckpt_restores_total",
        "counter",
        "Ranks restored, by source (local, peers, backup).",
        ("ckpt_job", "node_id", "source"),
    ),
    MetricDef("ckpt_restore_bytes_total", "counter", "Shard bytes fetched by restores.", ("ckpt_job", "node_id")),
    MetricDef(
        "ckpt_steps_lost_total",
        "counter",
        "Steps of training lost by recoveries (newest staged step - restored step).",
        ("ckpt_job",),
    ),
    MetricDef(
        "ckpt_recoveries_total", "counter", "Recoveries completed (first step done after a restore).", ("ckpt_job",)
    ),
    MetricDef(
        "ckpt_time_to_resume_seconds",
        "histogram",
        "Per recovery: kill -> first checkpointed step of the new attempt done.",
        ("ckpt_job",),
        RESUME_BUCKETS,
    ),
    MetricDef(
        "ckpt_last_time_to_resume_seconds", "gauge", "Time to resume of the job's latest recovery.", ("ckpt_job",)
    ),
    MetricDef(
        "ckpt_last_recovery_phase_seconds",
        "gauge",
        "Phases of the job's latest recovery: detect, restart (or in place: replace, rendezvous), "
        "locate, fetch, decode, load, first_step.",
        ("ckpt_job", "phase"),
    ),
    MetricDef(
        "ckpt_recovery_steps_lost",
        "histogram",
        "Per recovery: steps lost.",
        ("ckpt_job",),
        STEPS_BUCKETS,
    ),
    # failures
    MetricDef("ckpt_kills_total", "counter", "Nodes or stores killed by a fault-injection tool.", ("mode", "node_id")),
    MetricDef("ckpt_node_deaths_total", "counter", "Nodes Ray declared dead (as recorded).", ("node_id",)),
    # stores
    MetricDef("ckpt_store_used_bytes", "gauge", "Bytes a node's store holds (shards + metadata).", ("node_id",)),
    MetricDef("ckpt_store_budget_bytes", "gauge", "Bytes a node's store may hold.", ("node_id",)),
    MetricDef("ckpt_store_shards", "gauge", "Shards (and local copies) a node's store holds.", ("node_id",)),
    MetricDef("ckpt_store_job_bytes", "gauge", "Bytes a node's store holds for one job.", ("node_id", "ckpt_job")),
    # jobs
    MetricDef("ckpt_committed_step", "gauge", "Newest committed step of a job.", ("ckpt_job",)),
    MetricDef(
        "ckpt_protection",
        "gauge",
        "How many more node failures the newest committed step survives (min over ranks of live shards - k; "
        "negative: some rank can no longer be rebuilt from memory).",
        ("ckpt_job",),
    ),
    MetricDef("ckpt_events_total", "counter", "Events recorded by the registry, by kind.", ("kind",)),
)

NAMES = tuple(d.name for d in DEFINITIONS)
GAUGE_REFRESH_S = 5.0

_lock = threading.Lock()
_metrics: dict[str, Any] | None = None
_store_jobs: dict[str, set[str]] = {}  # node id -> jobs whose per-job gauge this process set
_gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}  # (name, tags) -> value to keep exporting
_refresher: threading.Thread | None = None


def _create() -> dict[str, Any]:
    from ray.util import metrics as ray_metrics

    created: dict[str, Any] = {}
    for d in DEFINITIONS:
        if d.kind == "counter":
            created[d.name] = ray_metrics.Counter(d.name, description=d.description, tag_keys=d.tags)
        elif d.kind == "gauge":
            created[d.name] = ray_metrics.Gauge(d.name, description=d.description, tag_keys=d.tags)
        else:
            created[d.name] = ray_metrics.Histogram(
                d.name, description=d.description, boundaries=list(d.boundaries), tag_keys=d.tags
            )
    return created


def _get() -> dict[str, Any]:
    """This process's metric objects, created on first use (empty if Ray's metrics are unusable)."""
    global _metrics
    if _metrics is None:
        with _lock:
            if _metrics is None:
                try:
                    _metrics = _create()
                except Exception as error:
                    logger.debug("ray_ckpt metrics are disabled in this process: %s", error)
                    _metrics = {}
    return _metrics


def _tags(**values: Any) -> dict[str, str]:
    return {k: "" if v is None else str(v) for k, v in values.items()}


def _observe(name: str, value: float, **tags: Any) -> None:
    metric = _get().get(name)
    if metric is not None:
        metric.observe(float(value), tags=_tags(**tags))


def _set(name: str, value: float, keep: bool = True, **tags: Any) -> None:
    """Set a gauge; with ``keep`` it is set again every GAUGE_REFRESH_S (else it ages out)."""
    metric = _get().get(name)
    if metric is None:
        return
    labels = _tags(**tags)
    metric.set(float(value), tags=labels)
    key = (name, tuple(sorted(labels.items())))
    with _lock:
        if keep:
            _gauges[key] = float(value)
        else:
            _gauges.pop(key, None)
    _start_refresher()


def _start_refresher() -> None:
    global _refresher
    with _lock:
        if _refresher is None:
            _refresher = threading.Thread(target=_refresh_gauges, name="ray_ckpt-metrics", daemon=True)
            _refresher.start()


def _refresh_gauges() -> None:
    while True:
        time.sleep(GAUGE_REFRESH_S)
        with _lock:
            kept = list(_gauges.items())
        for (name, labels), value in kept:
            try:
                _get()[name].set(value, tags=dict(labels))
            except Exception as error:
                logger.debug("ray_ckpt metrics: could not refresh %s: %s", name, error)


def _inc(name: str, value: float = 1.0, **tags: Any) -> None:
    metric = _get().get(name)
    if metric is not None and value > 0:
        metric.inc(float(value), tags=_tags(**tags))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# ---- recoveries: assembled from the events the registry sees (ray_ckpt.core.timeline) --------

_recoveries = timeline.LiveRecoveries()


# ---- the API --------------------------------------------------------------------------------


def observe_event(event: dict[str, Any]) -> None:
    """Record the metrics of one event (see ray_ckpt.core.events); called by the registry for
    every event it logs. Never raises."""
    try:
        _observe_event(event)
    except Exception as error:
        logger.debug("ray_ckpt metrics: could not observe event %r: %s", event, error)


def _observe_event(event: dict[str, Any]) -> None:
    kind = event.get("kind")
    _inc("ckpt_events_total", kind=kind)
    job, node_id = event.get("job"), event.get("node_id")
    phases = event.get("phases_s") or {}
    if kind == "save":
        for phase, value in phases.items():
            seconds = _number(value)
            if seconds is None or phase == "skipped":
                continue
            _observe("ckpt_save_phase_seconds", seconds, ckpt_job=job, node_id=node_id, phase=phase)
            if phase == "blocking":
                _observe("ckpt_save_blocking_seconds", seconds, ckpt_job=job, node_id=node_id)
        size = _number(event.get("bytes"))
        if size is not None:
            _set("ckpt_save_bytes", size, ckpt_job=job, node_id=node_id)
    elif kind == "restore" and event.get("step") is not None and int(event["step"]) >= 0:
        for phase, value in phases.items():
            seconds = _number(value)
            if seconds is not None:
                _observe("ckpt_restore_phase_seconds", seconds, ckpt_job=job, node_id=node_id, phase=phase)
        _inc("ckpt_restores_total", ckpt_job=job, node_id=node_id, source=event.get("source"))
        _inc("ckpt_restore_bytes_total", _number(event.get("bytes")) or 0.0, ckpt_job=job, node_id=node_id)
    elif kind == "interval":
        interval = _number(event.get("interval"))
        if interval is not None:
            _set("ckpt_save_interval_steps", interval, ckpt_job=job)
    elif kind == "kill":
        _inc("ckpt_kills_total", mode=event.get("mode"), node_id=node_id)
    elif kind == "node_dead":
        _inc("ckpt_node_deaths_total", node_id=node_id)
    steps_lost, done = _recoveries.add(event)
    if steps_lost:
        _inc("ckpt_steps_lost_total", steps_lost, ckpt_job=job)
    for recovery in done:
        _observe_recovery(recovery)


def _observe_recovery(recovery: timeline.Recovery) -> None:
    job = recovery.job
    _inc("ckpt_recoveries_total", ckpt_job=job)
    _observe("ckpt_recovery_steps_lost", recovery.steps_lost or 0, ckpt_job=job)
    resume = _number(recovery.time_to_resume_s)
    if resume is not None:
        _observe("ckpt_time_to_resume_seconds", resume, ckpt_job=job)
        _set("ckpt_last_time_to_resume_seconds", resume, ckpt_job=job)
    for phase in timeline.PHASES:
        seconds = _number(recovery.phases_s.get(phase)) or 0.0
        _set("ckpt_last_recovery_phase_seconds", seconds, ckpt_job=job, phase=phase)


def observe_store(stats: StoreStats) -> None:
    """Set a store's gauges from ``ShardStore.stats()``. Never raises."""
    try:
        node_id = stats.node_id
        _set("ckpt_store_used_bytes", stats.used_bytes, node_id=node_id)
        _set("ckpt_store_budget_bytes", stats.budget_bytes, node_id=node_id)
        _set("ckpt_store_shards", stats.shards, node_id=node_id)
        jobs = dict(stats.jobs)
        with _lock:
            gone = _store_jobs.get(node_id, set()) - set(jobs)
            _store_jobs[node_id] = set(jobs)
        for job in gone:  # 0 once, then the series ages out
            _set("ckpt_store_job_bytes", 0, keep=False, node_id=node_id, ckpt_job=job)
        for job, used in jobs.items():
            _set("ckpt_store_job_bytes", used, node_id=node_id, ckpt_job=job)
    except Exception as error:
        logger.debug("ray_ckpt metrics: could not observe store stats: %s", error)


def observe_job(job: str, committed_step: int | None, protection: int | None) -> None:
    """Set a job's committed-step and protection gauges (None leaves a gauge as it is). Never raises."""
    try:
        if committed_step is not None:
            _set("ckpt_committed_step", committed_step, ckpt_job=job)
        if protection is not None:
            _set("ckpt_protection", protection, ckpt_job=job)
    except Exception as error:
        logger.debug("ray_ckpt metrics: could not observe job %s: %s", job, error)


def protection(ranks: Mapping[int, RankRecord], live_nodes: set[str] | None = None) -> int | None:
    """How many more node failures a committed step survives (``ray_ckpt.core.protection``: from
    where its shards really are, the weakest rank counts), as ``ray_ckpt.status()`` reports
    it. ``ranks``: rank -> its ``RankRecord``, as the registry's ``locate`` returns them (a
    rank without shards is left out). ``live_nodes=None`` counts every shard as live."""
    placed = {rank: (record.nodes.values(), record.data_shards) for rank, record in ranks.items() if record.metas}
    return step_protection(placed, live_nodes)


def observe_committed(job: str, step: int, ranks: Mapping[int, RankRecord], live_nodes: set[str] | None = None) -> None:
    """Set a job's gauges for its newest committed ``step`` located at ``ranks``. Never raises."""
    try:
        observe_job(job, step, protection(ranks, live_nodes))
    except Exception as error:
        logger.debug("ray_ckpt metrics: could not observe commit of %s step %s: %s", job, step, error)


def observe_backup(job: str, size: int, node_id: str | None = None) -> None:
    """Count one rank's persistent backup of ``size`` bytes. Never raises."""
    try:
        if node_id is None:
            import ray

            node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        _inc("ckpt_backups_total", ckpt_job=job, node_id=node_id)
        _inc("ckpt_backup_bytes_total", size, ckpt_job=job, node_id=node_id)
    except Exception as error:
        logger.debug("ray_ckpt metrics: could not observe a backup of %s: %s", job, error)
