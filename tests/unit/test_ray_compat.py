"""The Ray internals ray_ckpt relies on (Ray Train's for in-place recovery, core Ray's for the
tools): this fails when a Ray upgrade moves them."""

from __future__ import annotations

import dataclasses
import inspect
import socket
import time
import types
from typing import Any, ClassVar

import pytest
import ray

from ray_ckpt import _ray_compat
from ray_ckpt.core.nodes import RayNode


def test_this_ray_is_one_the_replica_group_path_was_verified_on() -> None:
    """Upgrading Ray past the tested range fails here: re-verify the path, then widen TESTED_RAY."""
    assert _ray_compat.tested(), (_ray_compat.ray_version(), _ray_compat.TESTED_RAY)


def test_the_replica_group_path_is_found() -> None:
    path = _ray_compat.replica_groups()
    assert path.missing is None, path.missing
    assert path.torch_backend is _ray_compat.torch_backend_base()
    assert path.replica_group is not None and path.replica_group.__name__ == "ReplicaGroup"


def test_the_controller_replaces_only_failing_groups_when_the_size_is_unchanged() -> None:
    """The behaviour in-place recovery depends on, read from Ray's own code."""
    from ray.train.v2._internal.execution.controller.controller import TrainController
    from ray.train.v2._internal.execution.worker_group.worker_group import WorkerGroup

    decide = inspect.getsource(TrainController._execute_resize_decision)
    assert "failing_rgs != all_rgs" in decide and "_replace_bad_workers" in decide
    replace = inspect.getsource(WorkerGroup._replace_replica_group_impl)
    for needed in (
        "old_placement_group_bundle_indices",
        "sync_actor.reset",
        "clear_result_queue",
        "rg.is_active()",  # failing groups shut down first are left out of the clear
        "old_replica_group.get_workers()",  # a shut-down group keeps its workers' slots
        "starting_world_rank",
        # what replace_replica_groups does for several groups, in the same steps
        "self._world_rank_to_ongoing_poll.pop",
        "self._replica_group_callbacks",
        ".replace_workers(",
        "self._create_workers(",
        "self._init_train_context(",
        ".start_training(self._worker_group_context)",
        "self._worker_group_context.resources_per_worker",
    ):
        assert needed in replace, needed
    assert "self._replica_groups" in inspect.getsource(WorkerGroup)
    shutdown = inspect.getsource(_ray_compat.replica_groups().replica_group.shutdown)  # type: ignore[union-attr]
    assert "self._active = False" in shutdown and "self._workers = " not in shutdown


def test_a_replacement_gets_on_start_with_its_replica_group() -> None:
    from ray.train.v2._internal.callbacks.backend_setup import BackendSetupCallback
    from ray.train.v2._internal.execution.callback import ReplicaGroupCallback

    assert issubclass(BackendSetupCallback, ReplicaGroupCallback)
    assert "on_start" in inspect.getsource(BackendSetupCallback.after_execution_group_start)


def test_is_replica_group_tells_a_replacement_from_a_full_start() -> None:
    replica_group = _ray_compat.replica_groups().replica_group
    assert replica_group is not None
    group = replica_group([], {})
    assert _ray_compat.is_replica_group(group)
    assert not _ray_compat.is_replica_group(object())


def test_a_failed_replacement_restarts_the_worker_group_instead_of_ending_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A survivor dying while Ray replaces another worker makes replace_replica_group raise; the
    patched controller then shuts the group down and starts it again with the decision's size."""
    from ray.train.v2._internal.execution.controller.controller import TrainController

    replace = inspect.getsource(TrainController._replace_bad_workers)
    assert "self._worker_group.replace_replica_group(rg_index)" in replace  # what the patch does in its stead
    monkeypatch.setattr(_ray_compat, "_dead_groups", lambda groups, failing: set())
    monkeypatch.setattr(_ray_compat, "_await_failing_nodes", lambda groups, failing: None)
    _ray_compat.restart_when_a_replacement_fails()
    _ray_compat.restart_when_a_replacement_fails()  # idempotent

    calls: list[str] = []

    class ReplicaGroup:
        def __init__(self, index: int) -> None:
            self.index = index

        def shutdown(self) -> None:
            calls.append(f"shut group {self.index}")

    class Group:
        _replica_groups: ClassVar[list[ReplicaGroup]] = [ReplicaGroup(index) for index in range(3)]

        def replace_replica_group(self, index: int) -> None:
            raise RuntimeError("a survivor's node died")

    class Decision:
        num_workers, resources_per_worker = 3, {"CPU": 1}

    class Controller:
        _worker_group = Group()
        _ray_ckpt_decision = Decision()

        def _shutdown_worker_group(self) -> None:
            calls.append("shutdown")

        def _start_worker_group(self, num_workers: int, resources_per_worker: dict[str, float]) -> None:
            calls.append(f"start {num_workers} {resources_per_worker}")

    class PollStatus:
        failing_replica_group_indices = frozenset({1})

    TrainController._replace_bad_workers(Controller(), PollStatus())  # type: ignore[arg-type]
    assert calls == ["shut group 1", "shutdown", "start 3 {'CPU': 1}"]


@pytest.mark.parametrize("polled, late", [((0, 1), set()), ((0,), {1})], ids=["both-polled", "one-polled-late"])
def test_every_failing_group_is_shut_down_before_the_first_replacement(
    monkeypatch: pytest.MonkeyPatch, polled: tuple[int, ...], late: set[int]
) -> None:
    """Two workers lost with one node: neither replacement may ask the other dead worker to
    clear its result queue, so both groups are inactive before Ray replaces the first, also
    when the poll that ended first had heard of one death only (the other is found dead)."""
    from ray.train.v2._internal.execution.controller.controller import TrainController

    _ray_compat.restart_when_a_replacement_fails()
    swept: list[set[int]] = []

    def dead_groups(groups: list[Any], failing: set[int]) -> set[int]:
        swept.append(set(failing))
        return late

    monkeypatch.setattr(_ray_compat, "_dead_groups", dead_groups)
    monkeypatch.setattr(_ray_compat, "_await_failing_nodes", lambda groups, failing: None)
    calls: list[str] = []

    def replace_at_once(group: Any, indices: list[int]) -> None:
        active = [g.index for g in group._replica_groups if g.active]
        calls.append(f"replace {indices} at once, clearing {active}")

    monkeypatch.setattr(_ray_compat, "replace_replica_groups", replace_at_once)

    class ReplicaGroup:
        def __init__(self, index: int) -> None:
            self.index, self.active = index, True

        def shutdown(self) -> None:
            self.active = False
            calls.append(f"shut {self.index}")

    class Group:
        _replica_groups: ClassVar[list[ReplicaGroup]] = [ReplicaGroup(index) for index in range(4)]

        def replace_replica_group(self, index: int) -> None:
            active = [g.index for g in self._replica_groups if g.active and g.index != index]
            calls.append(f"replace {index}, clearing {active}")

    class Controller:
        _worker_group = Group()

    class PollStatus:
        failing_replica_group_indices = polled

    TrainController._replace_bad_workers(Controller(), PollStatus())  # type: ignore[arg-type]
    assert swept == [set(polled)]
    assert calls == ["shut 0", "shut 1", "replace [0, 1] at once, clearing [2, 3]"]


class _Actor:
    """A worker's actor handle whose calls answer at once (``ray.get`` is the identity here)."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log
        self.clear_result_queue = self.reset = self  # .remote() on either

    def remote(self) -> str:
        self.log.append(f"{self.name} called")
        return self.name


def _worker_group(monkeypatch: pytest.MonkeyPatch, log: list[str], fail_index: int | None = None) -> Any:
    """A WorkerGroup with 4 one-worker replica groups, whose ``_create_workers`` takes 0.5 s
    (a process starting) and records when each creation began and ended."""
    replica_group = _ray_compat.replica_groups().replica_group
    assert replica_group is not None
    # a replica group's shutdown kills its workers' actors (Ray's own; inactive is what counts here)
    monkeypatch.setattr(replica_group, "shutdown", lambda self: setattr(self, "_active", False))

    @dataclasses.dataclass
    class Worker:
        actor: Any
        placement_group_bundle_index: int
        distributed_context: Any = None

    class State:
        def __init__(self, workers: list[Any]) -> None:
            self.workers = workers
            self.sync_actor = _Actor("sync", log)
            self.placement_group_handle = types.SimpleNamespace(placement_group="pg")

        def replace_workers(self, old: list[Any], new: list[Any]) -> Any:
            return State([new[0] if w in old else w for w in self.workers])

    class Group:
        def __init__(self) -> None:
            workers = [Worker(_Actor(f"w{i}", log), i) for i in range(4)]
            self._replica_groups = [replica_group([w], {"CPU": 1}) for w in workers]
            self._worker_group_state = State(workers)
            self._worker_group_context = types.SimpleNamespace(resources_per_worker={"CPU": 1})
            self._world_rank_to_ongoing_poll: dict[int, Any] = {}
            self._replica_group_callbacks: list[Any] = []
            self.created: list[tuple[int, float, float]] = []

        def _assert_active(self) -> None:
            pass

        def _create_workers(self, **args: Any) -> list[Any]:
            began = time.monotonic()
            time.sleep(0.5)
            if args["starting_world_rank"] == fail_index:
                raise RuntimeError("the new worker's node died")
            self.created.append((args["starting_world_rank"], began, time.monotonic()))
            (index,) = args["placement_group_bundle_indices"]
            return [Worker(_Actor(f"new{index}", log), index)]

        def _init_train_context(self, workers: list[Any], sync_actor: Any) -> None:
            log.append(f"init {workers[0].actor.name}")

    return Group()


def test_several_failing_groups_get_their_new_workers_created_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two replica groups replaced together: both new workers are created at the same time (not
    the second after the first's process started), each slot keeps its bundle, the surviving
    groups' result queues are cleared once, and each new group's context is initialised and
    its training started in rank order."""
    log: list[str] = []
    monkeypatch.setattr(_ray_compat.ray, "get", lambda refs: refs)
    started: list[int] = []
    replica_group = _ray_compat.replica_groups().replica_group
    monkeypatch.setattr(replica_group, "start_training", lambda self, context: started.append(len(started)))
    group = _worker_group(monkeypatch, log)
    _ray_compat.replace_replica_groups(group, [1, 2])
    (first, _, ended_1), (_, began_2, _) = sorted(group.created)
    assert first == 1 and began_2 < ended_1, group.created  # the second began before the first ended
    assert [w.actor.name for w in group._worker_group_state.workers] == ["w0", "new1", "new2", "w3"]
    assert [g.get_workers()[0].actor.name for g in group._replica_groups] == ["w0", "new1", "new2", "w3"]
    assert log == ["w0 called", "w3 called", "sync called", "init new1", "init new2"]
    assert started == [0, 1]


def test_a_failed_creation_kills_the_other_new_workers_and_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    killed: list[str] = []
    monkeypatch.setattr(_ray_compat.ray, "get", lambda refs: refs)
    monkeypatch.setattr(_ray_compat.ray, "kill", lambda actor: killed.append(actor.name))
    group = _worker_group(monkeypatch, log, fail_index=2)
    with pytest.raises(RuntimeError, match="node died"):
        _ray_compat.replace_replica_groups(group, [1, 2])
    assert killed == ["new1"]
    assert not any(entry.startswith("init") for entry in log)


def test_warm_spares_find_the_raylet_call_and_the_setup_hook_ray_runs() -> None:
    """The raylet's PrestartWorkers call with the fields prestart_worker sets, and the env var
    through which Ray hands a worker process its setup hook (run before it takes any task)."""
    import ray._private.ray_constants as constants
    from ray._private.workers import default_worker
    from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc

    fields = set(node_manager_pb2.PrestartWorkersRequest.DESCRIPTOR.fields_by_name)
    assert {"language", "job_id", "runtime_env_info", "keep_alive_duration_secs", "num_workers"} <= fields
    assert hasattr(node_manager_pb2_grpc.NodeManagerServiceStub, "__init__")
    assert constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR == _ray_compat.SETUP_HOOK_ENV_VAR
    assert "WORKER_PROCESS_SETUP_HOOK_ENV_VAR" in inspect.getsource(default_worker)
    importlib_name = _ray_compat.train_worker_module()
    assert __import__(importlib_name, fromlist=["RayTrainWorker"]).RayTrainWorker is not None


def test_a_nodes_job_workers_are_listed_by_the_raylet_call_and_fields_ray_has() -> None:
    """job_workers reads the raylet's GetNodeStats reply: each core worker's pid, type, job,
    actor and task counts; an unreachable raylet is None, never an error."""
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc

    assert "include_memory_info" in node_manager_pb2.GetNodeStatsRequest.DESCRIPTOR.fields_by_name
    assert "core_workers_stats" in node_manager_pb2.GetNodeStatsReply.DESCRIPTOR.fields_by_name
    fields = set(common_pb2.CoreWorkerStats.DESCRIPTOR.fields_by_name)
    assert {"pid", "worker_type", "job_id", "actor_id", "num_executed_tasks", "num_running_tasks"} <= fields
    assert "GetNodeStats" in inspect.getsource(node_manager_pb2_grpc.NodeManagerServiceStub)
    assert _ray_compat.job_workers("127.0.0.1:1", "01000000") is None


def test_warm_process_notes_are_kept_per_job_and_node_and_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """What warm_up notes is listed back for its job and node only, and forget drops it."""
    stored: dict[bytes, bytes] = {}

    class KV:
        @staticmethod
        def _internal_kv_put(key: bytes, value: bytes, overwrite: bool, namespace: str) -> None:
            stored[key] = value

        @staticmethod
        def _internal_kv_list(prefix: bytes, namespace: str) -> list[bytes]:
            return [key for key in stored if key.startswith(prefix)]

        @staticmethod
        def _internal_kv_del(key: bytes, namespace: str) -> None:
            stored.pop(key, None)

    import ray.experimental

    monkeypatch.setattr(ray.experimental, "internal_kv", KV)
    for job, node, pid in (
        ("01000000", "n1", 11),
        ("01000000", "n1", 12),
        ("01000000", "n2", 13),
        ("02000000", "n1", 14),
    ):
        _ray_compat.note_warm_process(job, node, pid)
    assert _ray_compat.warm_processes("01000000", "n1") == {11, 12}
    _ray_compat.forget_warm_processes("01000000", "n1", {11})
    assert _ray_compat.warm_processes("01000000", "n1") == {12}
    assert _ray_compat.warm_processes("02000000", "n1") == {14}


def test_train_workers_get_the_warm_up_hook_in_their_runtime_env_once() -> None:
    """The patched WorkerGroup adds the hook to the workers' env vars, keeps the user's env vars
    and a hook the job already set, and patching again changes nothing."""
    from ray.train.v2._internal.execution.worker_group.worker_group import WorkerGroup

    _ray_compat.warm_worker_processes("ray_ckpt.train.inplace.warm_up")
    _ray_compat.warm_worker_processes("ray_ckpt.train.inplace.warm_up")
    env = WorkerGroup._get_worker_runtime_env({"env_vars": {"MINE": "1"}})
    assert env["env_vars"]["MINE"] == "1"
    assert env["env_vars"][_ray_compat.SETUP_HOOK_ENV_VAR] == "ray_ckpt.train.inplace.warm_up"
    theirs = WorkerGroup._get_worker_runtime_env({"env_vars": {_ray_compat.SETUP_HOOK_ENV_VAR: "job.hook"}})
    assert theirs["env_vars"][_ray_compat.SETUP_HOOK_ENV_VAR] == "job.hook"


def test_the_driver_printer_head_resource_and_log_folder_are_where_ray_keeps_them() -> None:
    """quiet_driver's hook is the function Ray's error listener calls by name for each cluster
    message (pid "raylet"); logs_dir reads the connected node's log folder; the head node is the
    one with Ray's internal head resource."""
    from ray._common.constants import HEAD_NODE_RESOURCE_NAME
    from ray._private import node, worker

    assert _ray_compat.driver_printer() is worker.print_to_stdstream
    assert next(iter(inspect.signature(worker.print_to_stdstream).parameters)) == "data"
    listener = inspect.getsource(worker.listen_error_messages)
    assert "print_to_stdstream(" in listener and '"pid": "raylet"' in listener
    assert hasattr(worker, "_global_node") and callable(node.Node.get_logs_dir_path)
    assert HEAD_NODE_RESOURCE_NAME == _ray_compat.HEAD_NODE_RESOURCE
    head = {"NodeID": "h", "Alive": True, "Resources": {HEAD_NODE_RESOURCE_NAME: 1.0, "CPU": 2.0}}
    assert _ray_compat.is_head_node(RayNode.from_ray(head))
    assert not _ray_compat.is_head_node(RayNode.from_ray({"NodeID": "w", "Alive": True, "Resources": {"CPU": 2.0}}))


@pytest.mark.parametrize("recovering", [True, False], ids=["recovering", "not-recovering"])
def test_the_controller_polls_its_workers_at_once_while_the_run_recovers_and_at_its_interval_otherwise(
    recovering: bool,
) -> None:
    """Ray's own ``_poll_workers``, patched, on a controller that polled just now with a 60 s
    health-check interval: while ``poll_promptly`` says the run recovers it polls within
    ``PROMPT_POLL_S`` and waits at most ``PROMPT_POLL_S`` for the workers' answers (Ray's poll
    waits up to the interval: one busy survivor would hold back a lost worker's error that
    long), and the interval is the controller's again after; otherwise it still waits out the
    interval."""
    import asyncio

    from ray.train.v2._internal.execution.controller import controller

    _ray_compat.restart_when_a_replacement_fails()
    source = inspect.getsource(controller.TrainController._poll_workers)
    for needed in (
        "self._latest_poll_time",
        "self._health_check_interval_s",
        "time_monotonic()",
        "poll_status(timeout=self._health_check_interval_s)",  # the interval bounds the wait for answers
    ):
        assert needed in source, needed
    polled: list[float | None] = []

    class WorkerGroup:
        def poll_status(self, timeout: float | None = None) -> str:
            polled.append(timeout)
            return "status"

    class State:
        def is_terminal(self) -> bool:
            return False

    class Controller:
        _health_check_interval_s = 60.0
        _latest_poll_time = controller.time_monotonic()
        _worker_group = WorkerGroup()

        def get_state(self) -> State:
            return State()

    async def poll(polling: Controller | None = None) -> Any:
        return await controller.TrainController._poll_workers(polling or Controller())  # type: ignore[arg-type]

    _ray_compat.poll_promptly(recovering)
    try:
        if recovering:
            polling = Controller()
            assert asyncio.run(asyncio.wait_for(poll(polling), timeout=10.0)) == "status"
            assert polled == [_ray_compat.PROMPT_POLL_S], "Ray's own poll ran, waiting PROMPT_POLL_S for answers"
            assert polling._health_check_interval_s == 60.0
        else:
            with pytest.raises(asyncio.TimeoutError):
                asyncio.run(asyncio.wait_for(poll(), timeout=0.5))
            assert polled == []
    finally:
        _ray_compat.poll_promptly(False)


def test_a_run_without_datasets_starts_no_dataset_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray Train starts a DatasetManager actor (a process importing Ray Data) at every worker
    group start; patched, a run without datasets gets ``NoDatasets`` instead, which answers as
    Ray's provider would (KeyError), and a run with datasets still gets Ray's own."""
    from ray.train.v2._internal.callbacks import datasets
    from ray.train.v2._internal.data_integration.interfaces import DatasetShardMetadata

    cls = datasets.DatasetsCallback
    monkeypatch.setattr(cls, "before_init_train_context", cls.before_init_train_context)  # undone after the test
    monkeypatch.setattr(cls, "_ray_ckpt_no_empty_manager", False, raising=False)
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(datasets, "RayDatasetShardProvider", lambda **kwargs: made.append(kwargs) or "ray's provider")
    _ray_compat.no_dataset_manager_without_datasets()
    _ray_compat.no_dataset_manager_without_datasets()  # idempotent

    class Worker:
        class metadata:
            node_id = "n"

    callback = object.__new__(cls)
    callback._datasets, callback._data_config, callback._data_context = {}, None, None
    callback._dataset_shard_provider = None
    providers = callback.before_init_train_context([Worker(), Worker()])["dataset_shard_provider"]
    assert made == [] and len(providers) == 2 and isinstance(providers[0], _ray_compat.NoDatasets)
    with pytest.raises(KeyError, match="'train' not found"):
        providers[0].get_dataset_shard(DatasetShardMetadata(dataset_name="train", world_rank=0))
    providers[0].shutdown_data_executors()
    callback.after_worker_group_shutdown(None)  # Ray's own: nothing of ours to shut down

    callback._datasets = {"train": object()}
    providers = callback.before_init_train_context([Worker()])["dataset_shard_provider"]
    assert providers == ["ray's provider"] and made[0]["world_size"] == 1


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_replacement_waits_for_rays_verdict_on_a_node_that_was_killed_or_went_silent() -> None:
    """A failing worker's node whose raylet answers (its process died, the node lives) needs no
    wait; one whose raylet is gone or silent is waited for until Ray lists it dead."""
    clock = _FakeClock()
    dead_at = {"killed": 1.0, "silent": 3.0}

    def nodes() -> list[RayNode]:
        return [
            RayNode(node_id=n, alive=True, address="10.0.0.1", raylet_port=1)
            for n in ("lives", "killed", "silent")
            if clock.now < dead_at.get(n, float("inf"))
        ]

    # a node that answers: no wait at all
    left = _ray_compat.await_node_verdicts(
        {"lives"}, nodes=nodes, answers=lambda address: True, clock=clock, sleep=clock.sleep
    )
    assert left == set() and clock.now == 0.0
    # a killed and a silent node: waited for until both are dead
    left = _ray_compat.await_node_verdicts(
        {"killed", "silent"}, nodes=nodes, answers=lambda address: False, clock=clock, sleep=clock.sleep
    )
    assert left == set() and 3.0 <= clock.now < 3.5
    # a node never declared dead: given up after the bound, named
    clock.now, dead_at["silent"] = 0.0, float("inf")
    left = _ray_compat.await_node_verdicts(
        {"silent"}, timeout_s=5.0, nodes=nodes, answers=lambda address: False, clock=clock, sleep=clock.sleep
    )
    assert left == {"silent"} and 5.0 <= clock.now < 5.5


def test_a_node_whose_raylet_stays_unanswering_is_declared_dead_once_instead_of_waited_for() -> None:
    """With fencing on, the nodes still without an answering raylet after ``fence_after_s`` are
    declared dead (once each) and the wait ends as soon as Ray lists them dead; a node whose
    raylet answers is never declared dead."""
    clock = _FakeClock()
    declared: list[str] = []
    dead: set[str] = set()

    def nodes() -> list[RayNode]:
        return [
            RayNode(node_id=n, alive=True, address="10.0.0.1", raylet_port=1)
            for n in ("lives", "killed", "silent")
            if n not in dead
        ]

    def declare(node_id: str, reason: str) -> bool:
        declared.append(node_id)
        if node_id != "silent":  # the GCS took one at once, the other a tick later
            dead.add(node_id)
        return True

    def answers(address: str | None) -> bool:
        if "silent" in declared:
            dead.add("silent")
        return False

    left = _ray_compat.await_node_verdicts(
        {"killed", "silent"},
        nodes=nodes,
        answers=answers,
        clock=clock,
        sleep=clock.sleep,
        fence_after_s=1.0,
        declare=declare,
    )
    assert left == set() and sorted(declared) == ["killed", "silent"] and 1.0 <= clock.now < 1.5
    left = _ray_compat.await_node_verdicts(
        {"lives"}, nodes=nodes, answers=lambda address: True, clock=clock, sleep=clock.sleep, fence_after_s=0.0,
        declare=declare,
    )  # fmt: skip
    assert left == set() and "lives" not in declared


def test_a_node_whose_host_refuses_its_raylets_port_is_declared_dead_without_waiting_out_the_silence_bound() -> None:
    """A refusal is an answer from the host that no raylet listens: the node is declared dead
    once refusals have gone on ``REFUSED_FENCE_AFTER_S`` (two in a row), not after
    ``fence_after_s``; a silent node beside it still waits that long."""
    clock = _FakeClock()
    declared: dict[str, float] = {}

    def nodes() -> list[RayNode]:
        return [
            RayNode(node_id=n, alive=True, address="10.0.0.1", raylet_port=port)
            for n, port in (("killed", 1), ("silent", 2))
            if n not in declared
        ]

    def declare(node_id: str, reason: str) -> bool:
        declared[node_id] = clock.now
        return True

    left = _ray_compat.await_node_verdicts(
        {"killed", "silent"},
        nodes=nodes,
        answers=lambda address: _ray_compat.REFUSED if address == "10.0.0.1:1" else False,
        clock=clock,
        sleep=clock.sleep,
        fence_after_s=1.0,
        declare=declare,
    )
    assert left == set()
    assert _ray_compat.REFUSED_FENCE_AFTER_S <= declared["killed"] < 0.5, declared
    assert 1.0 <= declared["silent"] < 1.5, declared


def test_a_refused_connection_is_told_apart_from_silence() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now: the host refuses
    assert _ray_compat.raylet_answers(f"127.0.0.1:{port}") == _ray_compat.REFUSED
    assert _ray_compat.raylet_answers(None) is False


def test_the_controller_waits_for_the_verdict_before_it_replaces_a_worker() -> None:
    assert "_await_failing_nodes(" in inspect.getsource(_ray_compat._patch_controller)
    from ray.train.v2._internal.execution.worker_group.worker import ActorMetadata, Worker

    assert "node_id" in inspect.signature(ActorMetadata).parameters
    assert "metadata" in Worker.__dataclass_fields__


def test_declaring_a_node_dead_uses_a_gcs_call_this_ray_has() -> None:
    """``declare_node_dead`` sends the GCS the request a raylet sends when it leaves; an upgrade
    that renames it fails here (the lab's test checks what the GCS does with it)."""
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import common_pb2, gcs_service_pb2, gcs_service_pb2_grpc

    fields = set(gcs_service_pb2.UnregisterNodeRequest.DESCRIPTOR.fields_by_name)  # type: ignore[attr-defined]
    assert fields == {"node_id", "node_death_info"}
    assert common_pb2.NodeDeathInfo.Reason.Value("UNEXPECTED_TERMINATION")  # type: ignore[attr-defined]
    assert "UnregisterNode" in inspect.getsource(gcs_service_pb2_grpc.NodeInfoGcsServiceStub)
    assert "address" in inspect.signature(init_grpc_channel).parameters


def test_declaring_a_node_dead_without_a_cluster_says_so_and_raises_nothing() -> None:
    assert _ray_compat.declare_node_dead("ab" * 28, "a test", timeout_s=0.5) is False


def test_drains_are_read_and_asked_for_through_calls_this_ray_has() -> None:
    """``draining_nodes`` and ``drain_node`` use the GCS calls ``ray drain-node`` and Ray Train's
    preemption watcher use; an upgrade that moves them fails here (the drain cluster test checks
    what the GCS does with them)."""
    from ray._private.state import GlobalState
    from ray.core.generated import autoscaler_pb2

    assert callable(GlobalState.get_draining_nodes)
    assert autoscaler_pb2.DrainNodeReason.Value(_ray_compat.PREEMPTION)  # type: ignore[attr-defined]
    signature = ray._raylet.InnerGcsClient.drain_node.__doc__ or ""  # a Cython method: its signature is its doc
    assert "node_id" in signature and "reason_message" in signature and "deadline_timestamp_ms" in signature
    assert "timeout" in signature


def test_ray_trains_preemption_notice_is_read_where_this_ray_keeps_it() -> None:
    """``preemption_notice`` reads the worker's train context, where Ray Train's preemption
    watcher puts what it found; outside a worker it says there is none."""
    from ray.train.v2._internal.execution.context import TrainContext, get_train_context
    from ray.train.v2.api.preemption import PreemptionInfo

    assert callable(get_train_context)
    assert "preemption_context" in {field.name for field in dataclasses.fields(TrainContext)}
    assert {field.name for field in dataclasses.fields(PreemptionInfo)} == {"deadline_ms", "preempted_node_to_ranks"}
    assert _ray_compat.preemption_notice() is None
