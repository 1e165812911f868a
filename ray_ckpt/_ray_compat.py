"""The Ray internals ray_ckpt relies on, all in one place.

Most are Ray Train's, for in-place recovery; the GCS call that declares a silent node dead
(``declare_node_dead``) is core Ray's, as are the rest, for the tools and the service: the
head node's internal resource, the function a driver prints the cluster's messages with, and
the connected node's log folder (at the end of this module).

In-place recovery rides on Ray Train's replica-group path: a backend whose
``has_replica_groups`` is True makes the controller replace only the failed workers (each worker
is one replica group in Ray 2.60) instead of restarting the whole worker group, and calls the
backend's ``on_start`` with the replacement ``ReplicaGroup``. Those names are internal to Ray,
so every use of them is here, behind ``replica_groups()``, which says whether this Ray has them.
``tests/unit/test_ray_compat.py`` fails when an upgrade moves or changes them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import inspect
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

from ray_ckpt.core.nodes import RayNode

logger = logging.getLogger(__name__)

TESTED_RAY = ((2, 60), (2, 61))  # [from, to): the versions whose replica-group path was verified


@dataclasses.dataclass(frozen=True)
class ReplicaGroups:
    """Ray's replica-group path: ``torch_backend`` (the class TorchConfig's backend is, to
    subclass), ``replica_group`` (the type ``on_start`` gets for a replacement), or
    ``missing`` (why this Ray cannot replace single workers; the other fields are then None)."""

    torch_backend: type | None
    replica_group: type | None
    missing: str | None = None


def ray_version() -> tuple[int, int]:
    major, minor = ray.__version__.split(".")[:2]
    return int(major), int(minor)


def tested() -> bool:
    """Whether this Ray's version is one the replica-group path was verified on."""
    low, high = TESTED_RAY
    return low <= ray_version() < high


def replica_groups() -> ReplicaGroups:
    """Look up the replica-group path in the installed Ray; never raises."""
    try:
        torch_config = importlib.import_module("ray.train.torch.config")
        execution = importlib.import_module("ray.train.v2._internal.execution.worker_group")
        controller = importlib.import_module("ray.train.v2._internal.execution.controller.controller")
        backend = importlib.import_module("ray.train.backend")
    except ImportError as error:
        return ReplicaGroups(None, None, f"Ray Train's modules are missing ({error})")
    torch_backend = getattr(torch_config, "_TorchBackend", None)
    replica_group = getattr(execution, "ReplicaGroup", None)
    train_controller = getattr(controller, "TrainController", None)
    if torch_backend is None or replica_group is None or train_controller is None:
        return ReplicaGroups(None, None, "Ray lacks _TorchBackend, ReplicaGroup or TrainController")
    if not hasattr(backend.Backend, "has_replica_groups"):
        return ReplicaGroups(None, None, "Ray's Backend has no has_replica_groups")
    decide = getattr(train_controller, "_execute_resize_decision", None)
    if decide is None or "_replace_bad_workers" not in inspect.getsource(decide):
        return ReplicaGroups(None, None, "Ray's controller does not replace single replica groups")
    return ReplicaGroups(torch_backend, replica_group)


def torch_backend_base() -> type:
    """The class to subclass for a backend that sets up torch.distributed like TorchConfig."""
    from ray.train.torch.config import _TorchBackend

    return _TorchBackend


def is_replica_group(group: Any) -> bool:
    """Whether ``on_start`` was called for one replacement replica group (not a full start)."""
    replica_group = replica_groups().replica_group
    return replica_group is not None and isinstance(group, replica_group)


def set_torch_distributed_env_vars() -> None:
    """Set LOCAL_RANK, RANK, WORLD_SIZE... in a worker as TorchConfig's full start does."""
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


PROMPT_POLL_S = 0.1  # how often the controller polls its workers while a recovery is under way
_recovering = threading.Event()  # this process's (the controller's) run is recovering in place


def poll_promptly(recovering: bool) -> None:
    """Say whether the run of this process's controller is recovering in place. While it is,
    the patched controller (``restart_when_a_replacement_fails``) polls its workers every
    ``PROMPT_POLL_S`` instead of every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, and waits at most
    ``PROMPT_POLL_S`` for their answers: it replaces a lost worker once Ray knows the worker is
    dead, not up to one interval later."""
    if recovering:
        _recovering.set()
    else:
        _recovering.clear()


def restart_when_a_replacement_fails() -> None:
    """Make Ray Train's controller replace several failed workers at once (every failing group
    is shut down before the first replacement, see ``_patch_controller``), and restart the whole
    worker group when replacing single workers fails, instead of ending the run. In Ray 2.60 a
    replacement asks every surviving worker to clear its result queue; if a survivor's node died
    meanwhile (a second failure during the recovery), that error escapes the controller's loop
    and ends the run with retries left. Also polls the workers promptly while the run
    recovers in place (``poll_promptly``).
    Patches ``TrainController`` and its subclasses in this process (Ray's actor machinery
    subclasses it and wraps its methods for tracing); called where the backend class is built,
    which includes the controller; idempotent."""
    controller = importlib.import_module("ray.train.v2._internal.execution.controller.controller")
    classes = [controller.TrainController, *_subclasses(controller.TrainController)]
    for cls in classes:
        if "_replace_bad_workers" in vars(cls) and not vars(cls).get("_ray_ckpt_restarts_on_failed_replacement"):
            _patch_controller(cls)


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _patch_controller(cls: Any) -> None:
    decide = cls._execute_resize_decision
    replace = cls._replace_bad_workers

    @functools.wraps(decide)
    def execute_resize_decision(self: Any, decision: Any) -> Any:
        self._ray_ckpt_decision = decision
        return decide(self, decision)

    @functools.wraps(replace)
    def replace_bad_workers(self: Any, poll_status: Any) -> None:
        try:
            # Ray 2.60 replaces failing groups one at a time, and each replacement asks every
            # other *active* group to clear its result queue, the failing ones included: with two
            # workers lost on one node, the first replacement waits on the second's dead actor
            # and fails. So every failing group is shut down first (as each replacement does to
            # its own; their workers' slots are kept), and so is every group whose worker died
            # with them but whose poll had not failed yet when this poll ended.
            groups = self._worker_group._replica_groups
            failing = set(poll_status.failing_replica_group_indices)
            # A replacement goes into its lost worker's placement-group bundle, which stays on
            # the worker's node until Ray declares the node dead: into a node that was killed or
            # went silent, it would wait for that and then fail (the whole group restarts).
            _await_failing_nodes(groups, failing)
            late = _dead_groups(groups, failing)
            if late:
                logger.warning(
                    "replica groups %s died with %s before their poll failed; replacing them together",
                    sorted(late),
                    sorted(failing),
                )
            else:
                logger.info("replacing the workers of failing replica groups %s in place", sorted(failing))
            replaced = sorted(failing | late)
            for index in replaced:
                groups[index].shutdown()
            if len(replaced) == 1:  # as Ray's own _replace_bad_workers does
                self._worker_group.replace_replica_group(replaced[0])
            else:
                replace_replica_groups(self._worker_group, replaced)
        except Exception as error:
            decision = self._ray_ckpt_decision
            logger.warning("replacing the failed workers failed (%s); restarting the worker group", error)
            if self._worker_group:
                self._shutdown_worker_group()
            self._start_worker_group(
                num_workers=decision.num_workers, resources_per_worker=decision.resources_per_worker
            )

    cls._execute_resize_decision = execute_resize_decision
    cls._replace_bad_workers = replace_bad_workers
    if "_poll_workers" in vars(cls):  # a subclass that does not define it inherits the patched one
        cls._poll_workers = _promptly_polling(cls._poll_workers)
    cls._ray_ckpt_restarts_on_failed_replacement = True


def replace_replica_groups(worker_group: Any, indices: list[int]) -> None:
    """Replace the failing replica groups ``indices`` of ``worker_group`` (the caller shut them
    all down first) as Ray 2.60's ``WorkerGroup.replace_replica_group`` replaces one, but with
    their new workers created at once: Ray's one at a time waits for each new worker's process
    to start (seconds where no warm spare waits) before it asks for the next. Then, one group
    after the other, each is recorded, its train context initialised and its training started,
    as Ray does. If a creation fails, the workers the others created are killed and the error
    is raised (the patched controller then restarts the whole worker group)."""
    from concurrent.futures import ThreadPoolExecutor

    from ray.exceptions import RayActorError
    from ray.train.v2._internal.exceptions import WorkerGroupStartupFailedError

    replica_group = replica_groups().replica_group
    worker_group._assert_active()
    old_workers = {index: worker_group._replica_groups[index].get_workers() for index in indices}
    for index in indices:  # shut down by the caller already: their workers' polls are dropped
        for worker in old_workers[index]:
            if worker.distributed_context is not None:
                worker_group._world_rank_to_ongoing_poll.pop(worker.distributed_context.world_rank, None)
    clear = [
        worker.actor.clear_result_queue.remote()
        for index, group in enumerate(worker_group._replica_groups)
        if index not in old_workers and group.is_active()
        for worker in group.get_workers()
    ]
    if clear:
        ray.get(clear)
    ray.get(worker_group._worker_group_state.sync_actor.reset.remote())
    placement_group = worker_group._worker_group_state.placement_group_handle.placement_group
    context = worker_group._worker_group_context

    def create(index: int) -> list[Any]:
        workers = old_workers[index]
        return list(
            worker_group._create_workers(
                num_workers=len(workers),
                placement_group=placement_group,
                resources_per_worker=context.resources_per_worker,
                placement_group_bundle_indices=[w.placement_group_bundle_index for w in workers],
                starting_world_rank=index,
                world_size=len(worker_group._replica_groups),
                replica_group_size=len(workers),
            )
        )

    with ThreadPoolExecutor(len(indices), thread_name_prefix="ray_ckpt-replace") as pool:
        pending = {index: pool.submit(create, index) for index in indices}
    created: dict[int, list[Any]] = {}
    failed: list[BaseException] = []
    for index, future in pending.items():
        error = future.exception()
        if error is None:
            created[index] = future.result()
        else:
            failed.append(error)
    if failed:
        for workers in created.values():
            for worker in workers:
                ray.kill(worker.actor)
        raise failed[0]
    for index in indices:
        new_workers = created[index]
        worker_group._worker_group_state = worker_group._worker_group_state.replace_workers(
            old_workers[index], new_workers
        )
        group = replica_group(new_workers, context.resources_per_worker, worker_group._replica_group_callbacks)  # type: ignore[misc]
        worker_group._replica_groups[index] = group
        try:
            worker_group._init_train_context(new_workers, worker_group._worker_group_state.sync_actor)
        except RayActorError as error:
            group.shutdown()
            raise WorkerGroupStartupFailedError(
                f"At least one replacement worker failed to initialize in replica group {index}."
            ) from error
        group.start_training(context)


# ---- fencing a silent node: Ray's verdict now, not after its health checks ---------------------

DECLARE_TIMEOUT_S = 1.0  # the GCS answers at once; it never answers for a node already removed


def declare_node_dead(node_id: str, reason: str, timeout_s: float = DECLARE_TIMEOUT_S) -> bool:
    """Tell the GCS that node ``node_id`` (hex) is dead, as its health checks would after about
    a minute of silence: it marks the node dead, fails or restarts the actors there, and moves
    the placement-group bundles it held; ``reason`` is recorded as the node's death message. The
    node cannot come back: when its raylet reaches the GCS again, it learns it was declared dead
    and exits, its workers with it. For a node ray_ckpt found silent (lost power, link, or route
    to the head) while one of its ranks failed; never for a node that is only slow.
    Returns False where this Ray lacks the call, or the GCS did not answer within ``timeout_s``
    (a node it already removed gets no answer); raises nothing."""
    try:
        import grpc
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import common_pb2, gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError as error:
        logger.warning("cannot declare node %s dead: this Ray lacks %s", node_id, error)
        return False
    death = common_pb2.NodeDeathInfo  # type: ignore[attr-defined]  # protobuf's generated names
    request = gcs_service_pb2.UnregisterNodeRequest(  # type: ignore[attr-defined]
        node_id=bytes.fromhex(node_id),
        node_death_info=death(reason=death.UNEXPECTED_TERMINATION, reason_message=reason),
    )
    try:
        channel = init_grpc_channel(ray.get_runtime_context().gcs_address)
        try:
            reply = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).UnregisterNode(request, timeout=timeout_s)
        finally:
            channel.close()
    except grpc.RpcError as error:
        logger.warning("declaring node %s dead: the GCS did not answer (%s)", node_id, error.code())
        return False
    except Exception as error:  # not connected, or a name moved: Ray's own checks still decide
        logger.warning("declaring node %s dead failed: %s", node_id, error)
        return False
    if reply.status.code != 0:
        logger.warning("the GCS refused to declare node %s dead: %s", node_id, reply.status.message)
        return False
    logger.warning("declared node %s dead: %s", node_id, reason)
    return True


NODE_VERDICT_TIMEOUT_S = 300.0  # the longest a replacement waits for Ray's verdict on a node
RAYLET_PROBE_S = 0.3  # a raylet that does not accept a connection this long is not answering
FENCE_AFTER_S = 1.0  # a failed worker's node whose raylet has been silent this long is declared dead
REFUSED_FENCE_AFTER_S = 0.2  # ... and one whose host refused connections to its raylet's port this long
_fencing = threading.Event()  # this process's (the controller's) run declares such nodes dead


def fence_nodes_without_raylet(fence: bool) -> None:
    """Say whether the patched controller of this process declares dead to Ray
    (``declare_node_dead``) the node of a failed worker whose raylet has not answered for
    ``FENCE_AFTER_S`` (killed, or silent), instead of waiting for Ray's health checks before it
    replaces the worker (``await_node_verdicts``)."""
    if fence:
        _fencing.set()
    else:
        _fencing.clear()


REFUSED = "refused"  # what ``raylet_answers`` says of a raylet whose host answers that nothing listens


def raylet_answers(address: str | None, timeout_s: float = RAYLET_PROBE_S) -> bool | str:
    """Whether the raylet at ``address`` ("ip:port") accepts a TCP connection within
    ``timeout_s``: True; ``REFUSED`` where its host refused the connection (it is up, and no
    raylet listens: the raylet is gone); False where it is silent or unknown."""
    if not address:
        return False
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return REFUSED
    except OSError:
        return False
    return True


def await_node_verdicts(
    node_ids: set[str],
    timeout_s: float = NODE_VERDICT_TIMEOUT_S,
    *,
    nodes: Callable[[], list[RayNode]] | None = None,
    answers: Callable[[str | None], bool | str] = raylet_answers,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    fence_after_s: float | None = None,
    declare: Callable[[str, str], bool] = declare_node_dead,
) -> set[str]:
    """Wait until Ray has a verdict on each node of ``node_ids``: declared dead, or alive with a
    raylet that answers (the worker died, its node lives: its bundle is good). A node whose
    raylet is gone (killed) or silent (power lost, link down, cut off) is waited for until Ray's
    health checks declare it dead, at most ``timeout_s``; with ``fence_after_s``, a node whose
    raylet has been silent that long is declared dead (``declare``, once) instead, and one whose
    host has refused connections to the raylet's port for ``REFUSED_FENCE_AFTER_S`` (the raylet
    is gone; said twice, so not a raylet still starting) at once. Returns the nodes still
    without a verdict then (logged; the replacement is tried anyway)."""
    listed = nodes if nodes is not None else _alive_ray_nodes
    started = clock()
    deadline = started + timeout_s
    waiting = set(node_ids)
    declared: set[str] = set()
    refused_since: dict[str, float] = {}  # node -> when its host first refused, in an unbroken run of refusals
    announced = False
    while waiting:
        alive = {node.node_id: node for node in listed()}
        replies = {n: answers(alive[n].raylet_address) for n in waiting if n in alive}
        waiting = {n for n, reply in replies.items() if reply is not True}
        refused_since = {n: refused_since.get(n, clock()) for n in waiting if replies[n] == REFUSED}
        if not waiting or clock() >= deadline:
            break
        if fence_after_s is not None:
            silent_long = waiting if clock() - started >= fence_after_s else set()
            refused_long = {n for n, since in refused_since.items() if clock() - since >= REFUSED_FENCE_AFTER_S}
            for node_id in sorted((silent_long | refused_long) - declared):
                declared.add(node_id)
                how = (
                    f"refused connections for {REFUSED_FENCE_AFTER_S} s"
                    if node_id in refused_long
                    else f"did not answer for {fence_after_s} s"
                )
                declare(node_id, f"ray_ckpt: a worker failed and this node's raylet {how}")
        if not announced:
            logger.warning("waiting for Ray to declare node(s) %s dead before replacing their workers", sorted(waiting))
            announced = True
        sleep(0.2)
    if waiting:
        logger.warning(
            "no verdict on node(s) %s after %.0f s; replacing their workers anyway", sorted(waiting), timeout_s
        )
    return waiting


def _await_failing_nodes(groups: list[Any], failing: set[int]) -> None:
    """``await_node_verdicts`` for the nodes of the failing replica groups' workers."""
    await_node_verdicts(
        {worker.metadata.node_id for index in failing for worker in groups[index].get_workers()},
        fence_after_s=FENCE_AFTER_S if _fencing.is_set() else None,
    )


def _alive_ray_nodes() -> list[RayNode]:
    return [node for node in (RayNode.from_ray(entry) for entry in ray.nodes()) if node.alive]


def _promptly_polling(poll: Any) -> Any:
    """The controller's ``_poll_workers``, which first sleeps out the rest of the health-check
    interval since its last poll, cut short while ``poll_promptly`` says the run recovers:
    then the poll comes ``PROMPT_POLL_S`` after the last one, and waits at most
    ``PROMPT_POLL_S`` for the workers' answers. Ray's poll waits for every worker's answer up
    to the interval (2 s by default): a survivor busy in its teardown would hold back the
    lost worker's error that long. A worker that has not answered counts as running and its
    answer is awaited at the next poll (Ray's rule for a poll that hangs), so no worker is
    taken for failed by the shorter wait. Ray's own method still runs (a sleep of at least a
    millisecond, so its check for a terminal state runs too), with the controller's interval
    set to ``PROMPT_POLL_S`` for the call and put back after it."""
    clock = importlib.import_module("ray.train.v2._internal.execution.controller.controller").time_monotonic

    @functools.wraps(poll)
    async def poll_workers(self: Any) -> Any:
        interval = self._health_check_interval_s
        while not _recovering.is_set():
            left = interval - (clock() - self._latest_poll_time)
            if left <= 0:
                break
            await asyncio.sleep(min(left, PROMPT_POLL_S))
        if not _recovering.is_set() or interval <= PROMPT_POLL_S:
            return await poll(self)
        since = clock() - self._latest_poll_time
        wait = max(1e-3, PROMPT_POLL_S - since)
        self._latest_poll_time = clock() - PROMPT_POLL_S + wait  # Ray's method sleeps ``wait``
        self._health_check_interval_s = PROMPT_POLL_S  # the sleep's bound and the poll's timeout
        try:
            return await poll(self)
        finally:
            self._health_check_interval_s = interval

    return poll_workers


def _dead_groups(groups: list[Any], failing: set[int], timeout_s: float = 60.0) -> set[int]:
    """The active replica groups outside ``failing`` with a worker whose actor is dead, found by
    the call Ray's replacement makes to them anyway (``clear_result_queue``; a live worker
    answers at once, a dead one raises once Ray knows). A worker that does not answer within
    ``timeout_s`` counts as alive: Ray's own call then waits on it."""
    calls = [
        (index, worker.actor.clear_result_queue.remote())
        for index, group in enumerate(groups)
        if index not in failing and group.is_active()
        for worker in group.get_workers()
    ]
    if not calls:
        return set()
    ready, _ = ray.wait([ref for _, ref in calls], num_returns=len(calls), timeout=timeout_s)
    answered = set(ready)
    dead: set[int] = set()
    for index, ref in calls:
        if ref in answered:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                dead.add(index)
    return dead


# ---- warm spares: replacements that start in a waiting, warmed-up process --------------------

SETUP_HOOK_ENV_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"  # how Ray hands a worker its setup hook


def warm_worker_processes(hook: str) -> None:
    """Make every Ray Train worker process this process's controller creates run ``hook`` (a
    "module.function" path) when the process starts, before its actor is created: Ray's
    ``worker_process_setup_hook`` as it passes one to a worker, an env var of the workers'
    runtime env. A prestarted worker with that runtime env (``prestart_worker``) then has the
    imports done before a replacement lands in it. Patches ``WorkerGroup._get_worker_runtime_env``
    in this process; leaves a setup hook the job already has alone; idempotent."""
    worker_group = importlib.import_module("ray.train.v2._internal.execution.worker_group.worker_group")
    cls = worker_group.WorkerGroup
    if getattr(cls, "_ray_ckpt_warm_hook", None) == hook:
        return
    original = cls._get_worker_runtime_env

    def get_worker_runtime_env(custom_runtime_env: Any) -> Any:
        runtime_env = original(custom_runtime_env)
        runtime_env["env_vars"] = {SETUP_HOOK_ENV_VAR: hook, **runtime_env.get("env_vars", {})}
        return runtime_env

    cls._get_worker_runtime_env = staticmethod(get_worker_runtime_env)
    cls._ray_ckpt_warm_hook = hook


class NoDatasets:
    """The dataset shard provider of a run without Ray Datasets: what Ray Train's would answer
    (a KeyError naming the dataset) without an actor behind it."""

    def get_dataset_shard(self, dataset_info: Any) -> Any:
        raise KeyError(
            f"Dataset shard for '{dataset_info.dataset_name}' not found. Please ensure that the dataset is "
            "passed through the Trainer `datasets` argument."
        )

    def shutdown_data_executors(self) -> None:
        """Nothing runs: nothing to shut down."""


def no_dataset_manager_without_datasets() -> None:
    """Make Ray Train start no ``DatasetManager`` actor for a worker group of a run that has no
    Ray Datasets. Ray 2.60 starts one at every worker group start, a replacement included: a
    new worker process on the controller's node that imports Ray Data (about 2 s of CPU) while
    the replacement's training function and restore run, alive as long as a worker started
    with it. Without datasets it only answers KeyError, as ``NoDatasets`` does. Patches
    ``DatasetsCallback.before_init_train_context`` in this process (the controller's);
    idempotent."""
    datasets = importlib.import_module("ray.train.v2._internal.callbacks.datasets")
    cls = datasets.DatasetsCallback
    if getattr(cls, "_ray_ckpt_no_empty_manager", False):
        return
    original = cls.before_init_train_context

    @functools.wraps(original)
    def before_init_train_context(self: Any, workers: list[Any]) -> dict[str, list[Any]]:
        if self._datasets:
            return original(self, workers)
        return {"dataset_shard_provider": [NoDatasets()] * len(workers)}

    cls.before_init_train_context = before_init_train_context
    cls._ray_ckpt_no_empty_manager = True


def train_worker_module() -> str:
    """The module of Ray Train's worker actor class (imported when such an actor is created)."""
    return "ray.train.v2._internal.execution.worker_group.worker"


def prestart_worker(raylet_address: str, runtime_env: str, job_id: str, keep_alive_s: int, count: int = 1) -> bool:
    """Ask the raylet at ``raylet_address`` ("host:port", a node's NodeManagerAddress and
    NodeManagerPort) to start ``count`` idle Python worker processes for the job ``job_id`` (hex)
    with the serialized ``runtime_env``, kept alive ``keep_alive_s``: the processes actors with
    that runtime env (Ray Train replacements) are then created in, with no process to start. Ray's
    raylet ``PrestartWorkers`` call (internal gRPC). True if it was accepted; logs and returns
    False otherwise; never raises."""
    try:
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
    except ImportError as error:
        logger.info("warm spares are off: Ray lacks the raylet's PrestartWorkers call (%s)", error)
        return False
    try:
        request = node_manager_pb2.PrestartWorkersRequest(  # type: ignore[attr-defined]
            language=common_pb2.PYTHON,  # type: ignore[attr-defined]
            job_id=bytes.fromhex(job_id),
            num_workers=count,
            keep_alive_duration_secs=int(keep_alive_s),
        )
        request.runtime_env_info.serialized_runtime_env = runtime_env
        channel = init_grpc_channel(raylet_address)
        try:
            node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=5)
        finally:
            channel.close()
        return True
    except Exception as error:  # an optimization: a replacement then starts a process as before
        logger.info("could not prestart a warm worker at %s: %s", raylet_address, error)
        return False


def job_workers(raylet_address: str, job_id: str) -> dict[int, bool] | None:
    """The worker processes of the job ``job_id`` (hex) on the node whose raylet is at
    ``raylet_address`` ("host:port"): pid -> whether it is idle (has run nothing yet, no actor
    and no task, as a prestarted worker such as a warm spare). Ray's raylet ``GetNodeStats``
    call (internal gRPC). None if the raylet could not be asked; never raises."""
    try:
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
    except ImportError as error:
        logger.info("cannot list a node's workers: Ray lacks the raylet's GetNodeStats call (%s)", error)
        return None
    try:
        job = bytes.fromhex(job_id)
        channel = init_grpc_channel(raylet_address)
        try:
            reply = node_manager_pb2_grpc.NodeManagerServiceStub(channel).GetNodeStats(
                node_manager_pb2.GetNodeStatsRequest(include_memory_info=False),  # type: ignore[attr-defined]
                timeout=5,
            )
        finally:
            channel.close()
        return {
            stats.pid: (
                not stats.actor_id.strip(b"\xff\x00") and stats.num_executed_tasks == 0 and stats.num_running_tasks == 0
            )
            for stats in reply.core_workers_stats
            if stats.worker_type == common_pb2.WORKER and stats.job_id == job  # type: ignore[attr-defined]
        }
    except Exception as error:
        logger.info("could not list the workers at %s: %s", raylet_address, error)
        return None


_WARM_NAMESPACE = "ray_ckpt"


def _warm_key(job_id: str, runtime_env: str, node_id: str) -> bytes:
    import hashlib

    env = hashlib.sha1(runtime_env.encode()).hexdigest()[:16]
    return f"warm:{job_id}:{env}:{node_id}".encode()


def note_warm_process(job_id: str, node_id: str, pid: int) -> None:
    """Note in the GCS that the process ``pid`` on ``node_id`` of the job ``job_id`` ran the
    warm-up hook (a spare, or a worker that started without one)."""
    from ray.experimental import internal_kv

    key = f"warmpid:{job_id}:{node_id}:{pid}".encode()
    internal_kv._internal_kv_put(key, b"", overwrite=True, namespace=_WARM_NAMESPACE)


def warm_processes(job_id: str, node_id: str) -> set[int]:
    """The pids ``note_warm_process`` noted for the job on ``node_id`` (live or not)."""
    from ray.experimental import internal_kv

    prefix = f"warmpid:{job_id}:{node_id}:".encode()
    keys = internal_kv._internal_kv_list(prefix, namespace=_WARM_NAMESPACE) or []
    return {int(key[len(prefix) :]) for key in keys}


def forget_warm_processes(job_id: str, node_id: str, pids: set[int]) -> None:
    """Drop the notes of ``pids`` (processes that are gone)."""
    from ray.experimental import internal_kv

    for pid in pids:
        internal_kv._internal_kv_del(f"warmpid:{job_id}:{node_id}:{pid}".encode(), namespace=_WARM_NAMESPACE)


def warm_spare_started(job_id: str, runtime_env: str, node_id: str) -> tuple[float, int] | None:
    """When the warm spares that wait on ``node_id`` for this job and runtime env were started,
    and how many the node keeps, as ``mark_warm_spare`` noted it in the GCS's key-value store
    (where every run of the job sees it: spares belong to the job); None if none waits there."""
    from ray.experimental import internal_kv

    value = internal_kv._internal_kv_get(_warm_key(job_id, runtime_env, node_id), namespace=_WARM_NAMESPACE)
    if value is None:
        return None
    started, _, count = value.decode().partition(" ")
    return float(started), int(count or 1)


def mark_warm_spare(job_id: str, runtime_env: str, node_id: str, started: float | None, count: int = 1) -> None:
    """Note that ``count`` warm spares started at ``started`` wait on ``node_id``, or (None) that
    a worker now runs there and took one or will not need them."""
    from ray.experimental import internal_kv

    key = _warm_key(job_id, runtime_env, node_id)
    if started is not None:
        internal_kv._internal_kv_put(key, f"{started!r} {count}".encode(), overwrite=True, namespace=_WARM_NAMESPACE)
    else:
        internal_kv._internal_kv_del(key, namespace=_WARM_NAMESPACE)


# ---- drains: nodes Ray was told will go (preemption, maintenance) ------------------------------

PREEMPTION = "DRAIN_NODE_REASON_PREEMPTION"  # the drain reason a cloud's reclaim of a node gives
DRAIN_CALL_S = 5.0  # the longest ``drain_node`` waits for the GCS


def draining_nodes() -> dict[str, float | None]:
    """The nodes the GCS says are draining: node id (hex) -> the deadline Ray was given (Unix
    seconds; None: no deadline). One GCS call (Ray keeps drains in its node manager's state,
    read through ``ray._private.state``, as Ray Train's preemption watcher reads it). Raises
    what the call raises: the caller decides whether a failed read means "none"."""
    from ray._private.state import state

    drains = state.get_draining_nodes()
    return {str(node): (int(deadline_ms) / 1000.0 if deadline_ms else None) for node, deadline_ms in drains.items()}


def drain_node(node_id: str, deadline_s: float, message: str) -> str | None:
    """Ask the GCS to drain node ``node_id`` (hex) for a preemption whose deadline is
    ``deadline_s`` (Unix seconds), as ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION``
    and a cloud's reclaim notice do: Ray schedules nothing new there, and what runs there goes
    on until the node is gone (Ray does not end it at the deadline). Returns None once the
    drain was accepted, else why it was not."""
    from ray.core.generated import autoscaler_pb2

    client = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)  # type: ignore[attr-defined]
    reason = autoscaler_pb2.DrainNodeReason.Value(PREEMPTION)  # type: ignore[attr-defined]
    accepted, refusal = client.drain_node(node_id, reason, message, int(deadline_s * 1000), timeout=DRAIN_CALL_S)
    return None if accepted else str(refusal or "refused")


def preemption_notice() -> tuple[dict[str, list[int]], float | None] | None:
    """What Ray Train's preemption watcher told this worker of a drain under way (it polls the
    GCS every ``RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S``, 5 s by default, for runs without replica
    groups): the draining nodes -> the world ranks there, and the earliest deadline (Unix
    seconds; None: none given). None when no drain was told, outside a Ray Train worker, or
    where this Ray keeps it elsewhere. Read from the worker's own train context: no collective
    (``ray.train.get_preemption_info`` is one, a barrier every rank must reach)."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        info = get_train_context().preemption_context.preemption_info
    except Exception:  # not a Ray Train worker, or the names moved
        return None
    if info is None:
        return None
    deadline = None if info.deadline_ms is None else int(info.deadline_ms) / 1000.0
    return {str(node): [int(r) for r in ranks] for node, ranks in info.preempted_node_to_ranks.items()}, deadline


# ---- the driver and the cluster: core Ray internals for the tools and the service -------------

HEAD_NODE_RESOURCE = "node:__internal_head__"  # the resource Ray gives the head node alone


def is_head_node(node: RayNode) -> bool:
    """Whether ``node`` (Ray's record of it) is the head node: Ray marks it with an internal
    resource, not a field."""
    return HEAD_NODE_RESOURCE in node.resources


def actor_id(handle: Any) -> str:
    """The id (hex) of the actor behind ``handle``: equal for every copy of a handle to one
    actor, so it names the actor without holding a reference to it (Ray's ``_actor_id``)."""
    return str(handle._actor_id.hex())


def driver_printer() -> Callable[..., Any] | None:
    """The function this driver prints the messages the cluster publishes to drivers with
    (``ray._private.worker.print_to_stdstream``, which Ray's listener thread looks up for every
    message), or None where this Ray has none."""
    from ray._private import worker

    return getattr(worker, "print_to_stdstream", None)


def set_driver_printer(printer: Callable[..., Any]) -> None:
    """Make ``printer`` the function :func:`driver_printer` returns, used for every later message."""
    from ray._private import worker

    worker.print_to_stdstream = printer


def ray_logs_dir() -> str | None:
    """Ray's log folder on this host for the connected cluster (the session's ``logs``), or None
    when this process is not connected or Ray does not say; never raises."""
    try:
        from ray._private import worker

        node = worker._global_node
        return None if node is None else str(node.get_logs_dir_path())
    except Exception:  # not connected, or an internal name moved
        return None
