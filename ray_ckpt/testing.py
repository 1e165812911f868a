"""A simulated multi-node Ray cluster on this machine, for the tests, the benchmarks and the demo.

- ``FAST_FAILURE_DETECTION``: the Ray ``_system_config`` under which a hard-killed node is
  declared dead in about 2 s instead of about 15 s.
- ``SimulatedCluster(workers, ...)``: a ``ray.cluster_utils.Cluster`` whose head has no CPUs
  (no rank runs there; it still gets a store) and no dashboard, plus ``workers`` nodes; this
  process connected to it (``log_to_driver=False``) and ``ray_ckpt.service.start`` run, unless
  told otherwise. It is a context manager: leaving it (or ``shutdown()``) disconnects and stops
  every node. Set ``RAY_TMPDIR`` to a short folder of your own before building one.
- ``digest(state)``: a hash of a state's snapshot bytes; equal digests mean bit-exact states.
  ``params_digest(model)``: the same promise for a torch model's parameters (a DTensor
  gathered first); ``busy(seconds)``: CPU compute standing in for a training step's.
- ``BenchRank`` and ``rank_actor()``: one training rank as a Ray actor, holding a generated
  state, saving and restoring it through a ``Checkpointer`` and timing it (the benchmarks);
  ``RawSink`` and ``sink_actor()``: what it pushes bare bytes to, the floor of a save's scatter.
- ``byte_state``, ``float_state``, ``touch``: the states the benchmarks save.

Importing this module loads neither Ray nor torch; they load when a cluster is built, a state
is made or a digest is taken.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

# A killed raylet refuses the checks at once: it is declared dead after about threshold x period.
# Each check may wait 2 s for an answer, so a raylet of a live node starved of CPU for seconds
# (every simulated node shares this machine's cores) is not declared dead, which ends the node
# (a 600 ms timeout did that to the head node once, under load).
FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 300,
    "health_check_timeout_ms": 2000,
    "health_check_failure_threshold": 3,
}
DEAD_TIMEOUT_S = 60.0  # how long kill() waits for Ray to declare the nodes dead
JOIN_TIMEOUT_S = 120.0  # how long add_workers() waits for new nodes to join (a loaded machine is slow)

_Cluster = TypeVar("_Cluster", bound="SimulatedCluster")


class SimulatedCluster:
    """A head (0 CPUs, dashboard off, ``head_object_store_bytes``) plus ``workers`` nodes of
    ``worker_cpus`` CPUs each; ``worker_object_store_bytes`` is one size for all workers or one
    per worker (None: Ray's default). With ``connect`` this process runs
    ``ray.init(address=..., namespace=namespace, log_to_driver=False)`` (``logging_level`` when
    given); with ``start_service`` also ``ray_ckpt.service.start(store_budget_bytes=...,
    namespace=namespace)``. ``namespace`` None: Ray's anonymous namespace for the driver and
    ray_ckpt's default (RAY_CKPT_NAMESPACE) for the service. If any of that fails, whatever
    was started is stopped before the error propagates.

    ``workers`` lists the worker node handles in the order they were added, less those killed
    through ``kill``; ``cluster`` is the ``ray.cluster_utils.Cluster`` itself."""

    def __init__(
        self,
        workers: int,
        *,
        store_budget_bytes: int | None = None,
        namespace: str | None = None,
        start_service: bool = True,
        connect: bool = True,
        worker_cpus: int = 1,
        head_object_store_bytes: int | None = None,
        worker_object_store_bytes: int | Sequence[int] | None = None,
        fast_failure_detection: bool = True,
        logging_level: str | None = None,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an int >= 0, got {workers!r}")
        if start_service and not connect:
            raise ValueError("start_service=True needs connect=True (the service is started from this process)")
        if isinstance(worker_object_store_bytes, Sequence) and len(worker_object_store_bytes) != workers:
            raise ValueError(
                f"worker_object_store_bytes lists {len(worker_object_store_bytes)} sizes for {workers} workers; "
                "give one size per worker, or one int for all"
            )
        from ray.cluster_utils import Cluster

        self.namespace = namespace
        self.worker_cpus = worker_cpus
        self.worker_object_store_bytes = worker_object_store_bytes
        head: dict[str, Any] = {"num_cpus": 0, "include_dashboard": False}
        if fast_failure_detection:
            head["_system_config"] = FAST_FAILURE_DETECTION
        if head_object_store_bytes is not None:
            head["object_store_memory"] = head_object_store_bytes
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.workers: list[Any] = []
        try:
            sizes = (
                list(worker_object_store_bytes)
                if isinstance(worker_object_store_bytes, Sequence)
                else [worker_object_store_bytes] * workers
            )
            self.workers = [self.cluster.add_node(**self._worker_args(size)) for size in sizes]
            self.cluster.wait_for_nodes()
            if connect:
                import ray

                extra: dict[str, Any] = {} if logging_level is None else {"logging_level": logging_level}
                ray.init(address=self.cluster.address, namespace=namespace, log_to_driver=False, **extra)
            if start_service:
                self.start_service(store_budget_bytes)
        except BaseException:
            self.shutdown()
            raise

    def _worker_args(self, object_store_bytes: int | None) -> dict[str, Any]:
        args: dict[str, Any] = {"num_cpus": self.worker_cpus}
        if object_store_bytes is not None:
            args["object_store_memory"] = object_store_bytes
        return args

    @property
    def address(self) -> str:
        """The cluster's address, for ``ray.init`` or ``RAY_ADDRESS``."""
        return str(self.cluster.address)

    def start_service(self, store_budget_bytes: int | None = None) -> dict[str, Any]:
        """``ray_ckpt.service.start`` in this cluster's namespace (idempotent; picks up new nodes)."""
        from ray_ckpt import service

        return service.start(store_budget_bytes=store_budget_bytes, namespace=self.namespace)

    def node_id(self, index: int) -> str:
        """The node id of ``workers[index]``."""
        return str(self.workers[index].node_id)

    def add_workers(self, count: int = 1) -> list[Any]:
        """Add ``count`` workers like the first ones (the same size as the last worker when
        sizes were given per worker), wait until Ray sees them; their handles. The registry
        starts their stores by itself."""
        sizes = self.worker_object_store_bytes
        size = (sizes[-1] if sizes else None) if isinstance(sizes, Sequence) else sizes
        added = [self.cluster.add_node(**self._worker_args(size)) for _ in range(count)]
        self.workers.extend(added)
        self.wait_alive(added)
        return added

    def wait_alive(self, nodes: Iterable[Any], timeout_s: float | None = None) -> None:
        """Wait until Ray lists every one of these node handles alive (other nodes may be dead
        or still dying meanwhile); TimeoutError naming the missing ones past ``timeout_s``
        (default ``JOIN_TIMEOUT_S``)."""
        import ray

        from ray_ckpt.transport import naming

        timeout_s = JOIN_TIMEOUT_S if timeout_s is None else timeout_s
        if not ray.is_initialized():  # not connected: Ray's own wait (every node must be alive)
            self.cluster.wait_for_nodes(timeout_s)
            return
        wanted = {str(n.node_id) for n in nodes}
        deadline = time.monotonic() + timeout_s
        while True:
            missing = wanted - naming.alive_node_ids()
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes {sorted(missing)} did not join the cluster within {timeout_s:.0f} s")
            time.sleep(0.2)

    def kill(self, node_ids: Iterable[str], timeout_s: float | None = None) -> float:
        """Hard-kill the given worker nodes at once (the ``ClusterNodeRemoval`` fault through
        ``chaos.inject``: ``remove_node(allow_graceful=False)``, kept out of the registry's
        events) and wait until Ray declares them all dead; the seconds that took. ValueError for a node that
        is not a live worker of this cluster (the head is never killed); TimeoutError past
        ``timeout_s`` (default ``DEAD_TIMEOUT_S``)."""
        from ray_ckpt.tools import chaos
        from ray_ckpt.tools.faults import ClusterNodeRemoval

        wanted = sorted({str(n) for n in node_ids})
        doomed = [n for n in self.workers if str(n.node_id) in wanted]
        if len(doomed) != len(wanted):
            raise ValueError(f"only worker nodes can be killed; {wanted} includes another node")
        started = time.monotonic()
        fault = ClusterNodeRemoval(self.cluster)
        wait_s = DEAD_TIMEOUT_S if timeout_s is None else timeout_s
        chaos.inject(fault, wanted, namespace=self.namespace, wait_dead_s=wait_s, record=False)
        for node in doomed:
            self.workers.remove(node)
        return time.monotonic() - started

    def shutdown(self) -> None:
        """Disconnect this process and stop every node; idempotent."""
        import ray

        ray.shutdown()
        self.cluster.shutdown()

    def __enter__(self: _Cluster) -> _Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def digest(state: Any) -> str:
    """SHA-256 of a state's canonical snapshot bytes (header + payload): equal digests mean
    bit-exact states."""
    from ray_ckpt.core import snapshot

    header, payload = snapshot.snapshot(state)
    return hashlib.sha256(header + payload.tobytes()).hexdigest()


def params_digest(model: Any) -> str:
    """SHA-256 of a torch model's full parameters, in ``state_dict`` order: equal digests mean
    bit-exact models. A DTensor is gathered first, so every rank of a sharded model must call
    this."""
    import torch

    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        digest.update(full.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def busy(seconds: float) -> None:
    """A long compute made of short torch operations, on a tensor of its own (no model is
    touched): a training step's CPU work, during which a checkpointer's threads compete."""
    import torch

    deadline = time.monotonic() + seconds
    x = torch.ones(128, 128)
    while time.monotonic() < deadline:
        x = torch.tanh(x @ x * 1e-3)


# ---- the benchmarks' states and rank ----------------------------------------------------------


def byte_state(size: int, seed: int) -> dict[str, Any]:
    """``{"w": <size random uint8, from seed>}``."""
    import numpy as np
    import torch

    return {"w": torch.from_numpy(np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8))}


def float_state(size: int) -> dict[str, Any]:
    """Four float32 tensors of ``size`` bytes in all (rounded down to whole floats), shaped like
    a model and its optimizer: ``{"model": {"embed.weight", "proj.weight"} (1/3 of the bytes),
    "optim": {"exp_avg", "exp_avg_sq"} (2/3)}``; the same for the same size."""
    import torch

    n = size // 4
    embed = n // 6
    proj = n // 6
    exp_avg = (n - embed - proj) // 2
    exp_avg_sq = n - embed - proj - exp_avg
    generator = torch.Generator().manual_seed(0)

    def tensor(count: int) -> torch.Tensor:
        return torch.rand(count, generator=generator, dtype=torch.float32)

    return {
        "model": {"embed.weight": tensor(embed), "proj.weight": tensor(proj)},
        "optim": {"exp_avg": tensor(exp_avg), "exp_avg_sq": tensor(exp_avg_sq)},
    }


def tensors_of(state: dict[str, Any]) -> list[Any]:
    """The tensors of a state of nested dicts, in insertion order."""
    found: list[Any] = []
    for value in state.values():
        found.extend(tensors_of(value) if isinstance(value, dict) else [value])
    return found


def state_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(state))


def touch(state: dict[str, Any]) -> None:
    """Change every tensor in place (``add_(1)``), as a training step would."""
    for tensor in tensors_of(state):
        tensor.add_(1)


STATES = ("bytes", "floats")


class BenchRank:
    """One training rank of a benchmark (run it as ``rank_actor()``): holds a state made at
    construction (``size`` 0: none, for a rank that only restores), saves it through a
    ``Checkpointer`` once ``connect`` made one, restores, and times a bare copy of it.

    ``state``: ``"bytes"`` is ``byte_state(size, seed)``, ``"floats"`` is ``float_state(size)``.
    Saves take the steps 0, 1, 2, ... in order."""

    def __init__(self, size: int = 0, *, seed: int = 0, state: str = "bytes") -> None:
        import torch

        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        made = {} if not size else byte_state(size, seed) if state == "bytes" else float_state(size)
        self.state: dict[str, Any] = made
        self.threads = torch.get_num_threads()
        self.checkpointer: Any = None
        self.step = 0

    def connect(
        self, namespace: str, job: str, rank: int, world_size: int, config: dict[str, Any], attempt: str | None = None
    ) -> None:
        """Make the Checkpointer (``config``: ``CheckpointConfig`` keyword arguments). Ranks of
        more than one that save without restoring first pass an ``attempt``, the same on each."""
        from ray_ckpt.checkpointer import Checkpointer
        from ray_ckpt.config import CheckpointConfig

        self.checkpointer = Checkpointer(
            job=job,
            rank=rank,
            world_size=world_size,
            config=CheckpointConfig(**config),
            namespace=namespace,
            attempt=attempt,
        )

    def info(self) -> dict[str, Any]:
        """``{"torch_threads", "state_bytes"}``."""
        return {"torch_threads": self.threads, "state_bytes": state_bytes(self.state)}

    def checksum(self) -> int:
        """XXH3-64 of the state's ``"w"`` tensor (the bytes state)."""
        from ray_ckpt.core.checksum import checksum

        return checksum(self.state["w"])

    def save(self, until: str = "done") -> dict[str, Any]:
        """Save the state as the next step and wait until the save is ``"done"`` (``wait()``) or
        ``"staged"``; ``{"step", "seconds"}`` (from the call until then) and ``"phases_s"``."""
        if until not in ("done", "staged"):
            raise ValueError(f"until must be 'done' or 'staged', got {until!r}")
        started = time.perf_counter()
        handle = self._save()
        if until == "done":
            handle.wait()
        else:
            handle.staged()
        seconds = time.perf_counter() - started
        return {"step": self.step - 1, "seconds": seconds, "phases_s": dict(self.checkpointer.last_save_phases_s)}

    def saves(self, repeats: int, back_to_back: bool, gap_s: float) -> list[dict[str, float]]:
        """One warm-up save, then ``repeats`` saves; each one's phases (the background fills in
        encode/scatter/stage), read once the last save is staged. Gapped (``back_to_back``
        False): each save starts ``gap_s`` after the previous one was staged, the state changed
        in place; back to back: each starts as soon as the previous one returned."""
        handle = self._save()  # warm-up: buffer allocation, first touch, actor handles
        if not back_to_back:
            handle.staged()
        phases = []
        for _ in range(repeats):
            if not back_to_back:
                time.sleep(gap_s)
                touch(self.state)
            handle = self._save()
            phases.append(self.checkpointer.last_save_phases_s)  # the dict of this save
            if not back_to_back:
                handle.staged()
        handle.staged()
        return [dict(p) for p in phases]

    def _save(self) -> Any:
        handle = self.checkpointer.save(self.step, self.state)
        self.step += 1
        return handle

    def memcpy(self, repeats: int) -> list[float]:
        """Seconds of ``repeats`` bare copies of the tensors into views of one preallocated
        uint8 buffer (after one untimed copy that takes the page faults)."""
        import torch

        tensors = tensors_of(self.state)
        buffer = torch.empty(state_bytes(self.state), dtype=torch.uint8)
        views, offset = [], 0
        for tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            views.append(buffer[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape))
            offset += nbytes
        times = []
        for attempt in range(repeats + 1):
            touch(self.state)
            started = time.perf_counter()
            for view, tensor in zip(views, tensors):
                view.copy_(tensor)
            elapsed = time.perf_counter() - started
            if attempt:
                times.append(elapsed)
        del views, buffer
        return times

    def restore(self) -> dict[str, Any]:
        """Time ``restore()``: ``{"step": None}`` if no step was committed, else ``{"step",
        "source", "seconds", "phases_s", "checksum", "size"}`` (XXH3-64 and element count of the
        restored ``"w"``)."""
        from ray_ckpt.core.checksum import checksum

        started = time.perf_counter()
        restored = self.checkpointer.restore()
        seconds = time.perf_counter() - started
        if restored is None:
            return {"step": None}
        tensor = restored.state["w"]
        return {
            "step": restored.step,
            "source": restored.source,
            "seconds": seconds,
            "phases_s": dict(restored.phases_s),
            "checksum": checksum(tensor),
            "size": int(tensor.numel()),
        }

    def close(self) -> None:
        """Close the Checkpointer (frees its host buffer)."""
        self.checkpointer.close()

    def raw_push(self, sinks: list[tuple[list[Any], int]], repeats: int) -> list[float]:
        """Seconds of ``repeats`` pushes of bare bytes to ``RawSink``s, all at once, one thread
        per sink (as a save writes its shards): ``(sink endpoint, bytes)`` each. The connections
        are opened first and kept; each push ends when every sink acknowledged its bytes. The
        floor a save's background scatter is compared with."""
        import threading

        import numpy as np

        sockets = [(_sink_connection(endpoint), size) for endpoint, size in sinks]
        payloads = [np.ones(size, dtype=np.uint8) for _, size in sockets]
        times = []
        failures: list[BaseException] = []

        def push(sock: Any, payload: Any) -> None:
            try:
                sock.sendall(payload.data)
                if sock.recv(1) != b"k":
                    raise ConnectionError("the sink did not acknowledge its bytes")
            except BaseException as error:
                failures.append(error)

        try:
            for _ in range(repeats + 1):  # the first push takes the page faults and slow start
                threads = [
                    threading.Thread(target=push, args=(sock, payload))
                    for (sock, _), payload in zip(sockets, payloads, strict=True)
                ]
                started = time.perf_counter()
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                times.append(time.perf_counter() - started)
                if failures:
                    raise failures[0]
        finally:
            for sock, _ in sockets:
                sock.close()
        return times[1:]


class RawSink:
    """Receives bare bytes (``BenchRank.raw_push``) on its node's address and on an abstract Unix
    socket, ``size`` bytes at a time into one buffer, acknowledging each with one byte."""

    def __init__(self, size: int) -> None:
        import socket
        import threading
        import uuid

        import numpy as np
        import ray

        self.buffer = np.empty(size, dtype=np.uint8)
        self.tcp = socket.create_server((ray.util.get_node_ip_address(), 0))
        self.unix_name = f"ray_ckpt-sink-{uuid.uuid4().hex[:12]}"
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind("\0" + self.unix_name)
        self.unix.listen()
        for server in (self.tcp, self.unix):
            threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def endpoint(self) -> list[Any]:
        """``[host, port, unix name, node id]``, for ``raw_push``."""
        import ray

        host, port = self.tcp.getsockname()[:2]
        return [host, port, self.unix_name, ray.get_runtime_context().get_node_id()]

    def _accept(self, server: Any) -> None:
        import threading

        while True:
            connection, _ = server.accept()
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: Any) -> None:
        view = self.buffer.data
        with connection:
            while True:
                got = 0
                while got < len(view):
                    n = connection.recv_into(view[got:])
                    if n == 0:
                        return
                    got += n
                connection.sendall(b"k")


def _sink_connection(endpoint: list[Any]) -> Any:
    """A connection to a ``RawSink``: its Unix socket from its own node, else TCP."""
    import socket

    import ray

    host, port, unix_name, node_id = endpoint
    if node_id == ray.get_runtime_context().get_node_id():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect("\0" + unix_name)
        return sock
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def sink_actor() -> Any:
    """``RawSink`` as a Ray actor class: no CPU, never restarted; pin it with a scheduling strategy."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(RawSink)


def rank_actor() -> Any:
    """``BenchRank`` as a Ray actor class: no CPU, never restarted; pin it with a scheduling
    strategy."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(BenchRank)
