"""A multi-host Ray cluster on one Linux machine: each worker node a host of its own on a network.

``NetworkLab(nodes=4, rate_gbit=2.5)`` builds, as root:

- a Linux bridge with the head's address (the head node's raylet, the GCS, and this process
  live in the machine's own network namespace, on the bridge);
- per worker node a network namespace with one veth pair to the bridge (named ``eth0`` inside,
  its own IPv4 address), optionally shaped to a rate in each direction (``tc ... tbf``);
- a Ray head (``ray start --head``, no CPUs) and one ``ray start`` per node inside its
  namespace, each started with ``setsid`` and stopped by killing its process group, with a
  custom resource ``lab_node_<i>`` that pins work to node i. Ray's token authentication is off
  (``RAY_AUTH_MODE=disabled``): the bridge is private to this machine, and a process that
  imported Ray before it joins could not take a token from its environment any more.

So a node can fail the way a machine does without closing a socket: its link goes down, its
processes freeze, it is cut from some peers (``ray_ckpt.tools.link_faults``). Traffic between
nodes crosses the bridge at the link's rate instead of at loopback speed.

Everything the lab makes is named ``rckl<run>...`` (``run``: 4 hex digits) and recorded in a
state file (``<RAY_CKPT_LAB_DIR>/<run>.json``, default ``/run/ray-ckpt-lab``) before it is made,
so ``close()`` (or ``clean_stale()`` on a later start, after a crash) removes exactly that:
namespaces, links, rules inside the namespaces, processes. Nothing else is touched.

``lab_unsupported()`` says why this machine cannot run a lab (not root, no ``ip``, namespaces
refused), or None. The lab is for testing recovery, never for production clusters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from ray_ckpt.errors import ConfigError, LabError

PREFIX = "rckl"
STATE_DIR_ENV = "RAY_CKPT_LAB_DIR"
DEFAULT_STATE_DIR = "/run/ray-ckpt-lab"
HEAD_OCTET = 1
FIRST_NODE_OCTET = 10
JOIN_TIMEOUT_S = 120.0
TBF_BURST = "256kb"
TBF_LATENCY = "100ms"


def state_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(STATE_DIR_ENV, DEFAULT_STATE_DIR))


def sh(*args: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one command (inside ``namespace`` when given); LabError with its stderr on failure."""
    command = ["ip", "netns", "exec", namespace, *args] if namespace else list(args)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise LabError(f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def lab_unsupported() -> str | None:
    """Why a lab cannot be built here (None when it can): root, ``ip``, ``tc`` and a network
    namespace of our own are needed."""
    if sys.platform != "linux":
        return "the network lab needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the network lab needs root (it creates network namespaces, links and a bridge)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the network lab needs `{tool}` (Debian: iproute2)"
    probe = f"{PREFIX}probe{os.getpid() % 10000}"
    made = sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"this machine refuses network namespaces: {made.stderr.strip()}"
    sh("ip", "netns", "delete", probe, check=False)
    return None


def nft_unsupported() -> str | None:
    """Why partitions cannot be made here (None when they can): they need ``nft``."""
    if shutil.which("nft") is None:
        return "partitions need `nft` (Debian: apt-get install nftables)"
    return None


@dataclasses.dataclass(frozen=True)
class LabNode:
    """One worker node of a lab: its namespace, its link on the bridge, its address, and the
    custom resource that pins work to it."""

    index: int
    namespace: str
    link: str
    address: str

    @property
    def resource(self) -> str:
        return f"lab_node_{self.index}"

    def pids(self) -> list[int]:
        """Every process in the node's namespace (its raylet, workers, agents)."""
        done = sh("ip", "netns", "pids", self.namespace, check=False)
        return [int(p) for p in done.stdout.split()]

    def signal_all(self, *signals: signal.Signals) -> int:
        """Send each of ``signals``, in order, to every process of the node; how many processes."""
        pids = self.pids()
        for sig in signals:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        return len(pids)

    def kill(self) -> int:
        """SIGKILL every process of the node, frozen ones woken to die; how many."""
        return self.signal_all(signal.SIGKILL, signal.SIGCONT)


@dataclasses.dataclass
class LabState:
    """What a lab made, written before it is made: enough to take it all down from any process."""

    run: str
    owner_pid: int
    subnet: str  # "10.a.b": the first three octets of the lab's /24
    bridge: str
    rate_gbit: float | None
    nodes: list[LabNode]
    head_port: int = 0
    head_pgid: int = 0
    node_pgids: dict[int, int] = dataclasses.field(default_factory=dict)
    temp_dir: str = ""

    @property
    def head_ip(self) -> str:
        return f"{self.subnet}.{HEAD_OCTET}"

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.head_port}"

    @property
    def path(self) -> pathlib.Path:
        return state_dir() / f"{self.run}.json"

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        document = dataclasses.asdict(self)
        self.path.with_suffix(".tmp").write_text(json.dumps(document))
        self.path.with_suffix(".tmp").replace(self.path)

    @classmethod
    def read(cls, path: pathlib.Path) -> LabState:
        document = json.loads(path.read_text())
        document["nodes"] = [LabNode(**n) for n in document["nodes"]]
        document["node_pgids"] = {int(k): v for k, v in document["node_pgids"].items()}
        return cls(**document)

    def environment(self) -> dict[str, str]:
        """What every process of this lab's Ray cluster has in its environment."""
        return {"RAY_AUTH_MODE": "disabled"}


def labs() -> list[LabState]:
    """Every lab whose state file is on this machine (running or left by a crashed process)."""
    found = []
    for path in sorted(state_dir().glob("*.json")):
        try:
            found.append(LabState.read(path))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return found


def find_node(address: str) -> tuple[LabState, LabNode] | None:
    """The lab node with this IP address, if a lab on this machine has one."""
    for lab in labs():
        for node in lab.nodes:
            if node.address == address:
                return lab, node
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pgid: int) -> None:
    if pgid > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def teardown(state: LabState) -> None:
    """Take down everything ``state`` records: processes (head's group, each node's group and
    whatever still runs in a node's namespace, frozen ones woken to die), namespaces (their
    links and rules go with them), the bridge, the temp folder, the state file. Idempotent."""
    for node in state.nodes:
        node.kill()
    for pgid in [state.head_pgid, *state.node_pgids.values()]:
        _kill_group(pgid)
    for node in state.nodes:
        sh("ip", "netns", "delete", node.namespace, check=False)
        sh("ip", "link", "delete", node.link, check=False)
    sh("ip", "link", "delete", state.bridge, check=False)
    if state.temp_dir:
        shutil.rmtree(state.temp_dir, ignore_errors=True)
        pathlib.Path(state.temp_dir + ".log").unlink(missing_ok=True)
    state.path.unlink(missing_ok=True)


def clean_stale() -> list[str]:
    """Take down labs whose owner process is gone (a crash, a kill), then any namespace or
    link named like a lab's that no live lab records; the runs (or names) removed."""
    removed = []
    live_names: set[str] = set()
    for state in labs():
        if _alive(state.owner_pid):
            live_names.update([state.bridge, *(n.namespace for n in state.nodes), *(n.link for n in state.nodes)])
            continue
        teardown(state)
        removed.append(state.run)
    for name in sh("ip", "netns", "list", check=False).stdout.split():
        if name.startswith(PREFIX) and name not in live_names:
            sh("ip", "netns", "delete", name, check=False)
            removed.append(name)
    links = sh("ip", "-o", "link", "show", check=False).stdout.splitlines()
    for line in links:
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(PREFIX) and name not in live_names:
            sh("ip", "link", "delete", name, check=False)
            removed.append(name)
    return removed


def _free_subnet(run: str) -> str:
    """A 10.x.y /24 that no address or route of this machine uses."""
    used = sh("ip", "-4", "-o", "addr", "show", check=False).stdout + sh("ip", "-4", "route", check=False).stdout
    seed = int(run, 16)
    for attempt in range(256):
        second, third = 200 + (seed + attempt) % 50, (seed * 7 + attempt * 13) % 250 + 1
        subnet = f"10.{second}.{third}"
        if f" {subnet}." not in f" {used}" and f"\n{subnet}." not in used:
            return subnet
    raise LabError("no free 10.x.y.0/24 subnet for the lab's bridge")


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _shape(link: str, gbit: float, namespace: str | None = None) -> None:
    sh("tc", "qdisc", "replace", "dev", link, "root", "tbf", "rate", f"{gbit * 1000:.3f}mbit",
       "burst", TBF_BURST, "latency", TBF_LATENCY, namespace=namespace)  # fmt: skip


def _unshape(link: str, namespace: str | None = None) -> None:
    sh("tc", "qdisc", "del", "dev", link, "root", namespace=namespace, check=False)


def set_rate(node: LabNode, gbit: float | None) -> None:
    """Shape the node's link to ``gbit`` Gbit/s in each direction (None: unshaped)."""
    if gbit is None:
        _unshape(node.link)
        _unshape("eth0", node.namespace)
        return
    if not gbit > 0:
        raise ConfigError(f"a link's rate must be positive Gbit/s, not {gbit!r}")
    _shape(node.link, gbit)
    _shape("eth0", gbit, node.namespace)


class NetworkLab:
    """A lab of ``nodes`` worker nodes with ``cpus`` CPUs each, links at ``rate_gbit`` (None:
    unshaped). ``start()`` builds it and returns the head's address; with ``connect`` this
    process joins it as a Ray driver (``ray.init``, ``namespace``). A context manager: leaving
    it disconnects and takes everything down. ``system_config``: the head's Ray
    ``_system_config`` (default: Ray's own, as a real cluster has)."""

    def __init__(
        self,
        nodes: int = 4,
        *,
        cpus: int = 1,
        rate_gbit: float | None = None,
        object_store_bytes: int = 256 << 20,
        system_config: dict[str, Any] | None = None,
        node_env: dict[str, str] | None = None,
    ) -> None:
        if not 1 <= nodes <= 200:
            raise ConfigError(f"a lab has 1 to 200 worker nodes, not {nodes}")
        if cpus < 1:
            raise ConfigError(f"each lab node needs at least 1 CPU, not {cpus}")
        if rate_gbit is not None and not rate_gbit > 0:
            raise ConfigError(f"rate_gbit must be positive (or None: unshaped), not {rate_gbit!r}")
        self.cpus = cpus
        self.object_store_bytes = object_store_bytes
        self.system_config = system_config
        self.node_env = dict(node_env or {})
        run = secrets.token_hex(2)
        name = f"{PREFIX}{run}"
        subnet = ""  # chosen in start(), once stale labs are gone
        self.state = LabState(
            run=run,
            owner_pid=os.getpid(),
            subnet=subnet,
            bridge=f"{name}br",
            rate_gbit=rate_gbit,
            nodes=[LabNode(index=i, namespace=f"{name}n{i}", link=f"{name}h{i}", address="") for i in range(nodes)],
        )
        self._connected = False

    @property
    def nodes(self) -> list[LabNode]:
        return self.state.nodes

    @property
    def address(self) -> str:
        return self.state.address

    def start(self, *, connect: bool = True, namespace: str | None = None) -> str:
        """Build the network, start the head and every node (one at a time), wait until all
        joined. On any failure everything made so far is taken down and the error raised."""
        reason = lab_unsupported()
        if reason is not None:
            raise LabError(reason)
        clean_stale()
        state = self.state
        state.subnet = _free_subnet(state.run)
        state.nodes = [
            dataclasses.replace(n, address=f"{state.subnet}.{FIRST_NODE_OCTET + n.index}") for n in state.nodes
        ]
        state.temp_dir = os.path.join(tempfile.gettempdir(), f"{PREFIX}{state.run}")
        state.write()
        try:
            self._build_network()
            self._start_head()
            os.environ.update(state.environment())
            self._connect(namespace)
            for node in state.nodes:
                self._start_node(node)
                self._wait_joined({n.resource for n in state.nodes[: node.index + 1]})
            if not connect:
                import ray

                ray.shutdown()
                self._connected = False
        except BaseException:
            self.close()
            raise
        return state.address

    def _build_network(self) -> None:
        state = self.state
        sh("ip", "link", "add", state.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{state.head_ip}/24", "dev", state.bridge)
        sh("ip", "link", "set", state.bridge, "up")
        for node in state.nodes:
            peer = f"{PREFIX}{state.run}p{node.index}"
            sh("ip", "netns", "add", node.namespace)
            sh("ip", "link", "add", node.link, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "netns", node.namespace)
            sh("ip", "link", "set", peer, "name", "eth0", namespace=node.namespace)
            sh("ip", "addr", "add", f"{node.address}/24", "dev", "eth0", namespace=node.namespace)
            sh("ip", "link", "set", "eth0", "up", namespace=node.namespace)
            sh("ip", "link", "set", "lo", "up", namespace=node.namespace)
            sh("ip", "link", "set", node.link, "master", state.bridge, "up")
            if state.rate_gbit is not None:
                set_rate(node, state.rate_gbit)

    def _ray_start(self, args: list[str], namespace: str | None, extra_env: dict[str, str]) -> int:
        """``setsid ray start ... --block`` (inside ``namespace``); its process group."""
        env = {**os.environ, **self.state.environment(), "RAY_DISABLE_USAGE_STATS": "1", **extra_env}
        ray_cli = str(pathlib.Path(sys.executable).with_name("ray"))
        command = [ray_cli, "start", *args, "--block", "--disable-usage-stats"]
        if namespace is not None:
            command = ["ip", "netns", "exec", namespace, *command]
        log = open(pathlib.Path(self.state.temp_dir + ".log"), "ab")  # noqa: SIM115 - the child keeps it
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return process.pid

    def _start_head(self) -> None:
        state = self.state
        state.head_port = _free_port(state.head_ip)
        args = [
            "--head", "--node-ip-address", state.head_ip, "--port", str(state.head_port), "--num-cpus", "0",
            "--include-dashboard=false", "--temp-dir", state.temp_dir,
            "--object-store-memory", str(self.object_store_bytes),
        ]  # fmt: skip
        if self.system_config:
            args += ["--system-config", json.dumps(self.system_config)]
        state.head_pgid = self._ray_start(args, None, {})
        state.write()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                probe.settimeout(1.0)
                if probe.connect_ex((state.head_ip, state.head_port)) == 0:
                    return
            if not _alive(state.head_pgid):
                break
            time.sleep(0.5)
        raise LabError(f"the lab's head did not come up at {state.address} (see {state.temp_dir}.log)")

    def _connect(self, namespace: str | None) -> None:
        """``ray.init`` to the head, retried until its raylet is up (its GCS port opens first)."""
        import ray

        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while True:
            try:
                ray.init(address=self.state.address, namespace=namespace, log_to_driver=False)
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        self._connected = True

    def _start_node(self, node: LabNode) -> None:
        state = self.state
        args = [
            "--address", state.address, "--node-ip-address", node.address, "--num-cpus", str(self.cpus),
            "--resources", json.dumps({node.resource: 1}), "--object-store-memory", str(self.object_store_bytes),
        ]  # fmt: skip
        env = {"GLOO_SOCKET_IFNAME": "eth0", **self.node_env}
        state.node_pgids[node.index] = self._ray_start(args, node.namespace, env)
        state.write()

    def _wait_joined(self, resources: set[str]) -> None:
        import ray

        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while time.monotonic() < deadline:
            alive = {r for n in ray.nodes() if n.get("Alive") for r in n.get("Resources", {})}
            if resources <= alive:
                return
            time.sleep(0.5)
        missing = sorted(resources - alive)
        log = f"{self.state.temp_dir}.log"
        raise LabError(f"lab nodes {missing} did not join within {JOIN_TIMEOUT_S:.0f} s (see {log})")

    def restart_node(self, node: LabNode) -> None:
        """Start the node's Ray again (a machine back after a failure; a new Ray node with the
        same address and resource), its old processes killed first and the old node declared
        dead to Ray (its processes are gone: Ray's health checks would say so only after several
        seconds); waits until it joined."""
        node.kill()
        _kill_group(self.state.node_pgids.get(node.index, 0))
        from ray_ckpt import _ray_compat

        old = self.live_node_id(node)
        if old is not None:
            _ray_compat.declare_node_dead(old, "ray_ckpt lab: the node's processes were killed")
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while self.live_node_id(node) is not None:
            if time.monotonic() > deadline:  # Ray's health checks declare the old node dead first
                raise LabError(f"Ray still lists lab node {node.address} alive after its processes died")
            time.sleep(0.5)
        self._start_node(node)
        self._wait_joined({node.resource})

    def live_node_id(self, node: LabNode) -> str | None:
        """The Ray node id of a lab node that Ray lists alive (None: none is)."""
        import ray

        for entry in ray.nodes():
            if entry.get("Alive") and entry.get("NodeManagerAddress") == node.address:
                return str(entry["NodeID"])
        return None

    def node_id(self, node: LabNode) -> str:
        """The Ray node id of a lab node (alive or not)."""
        import ray

        for entry in sorted(ray.nodes(), key=lambda e: not e.get("Alive")):  # the live one first
            if entry.get("NodeManagerAddress") == node.address:
                return str(entry["NodeID"])
        raise LabError(f"no Ray node has address {node.address}")

    def close(self) -> None:
        """Disconnect this process and take the whole lab down (idempotent)."""
        if self._connected:
            import ray

            try:
                ray.shutdown()
            finally:
                self._connected = False
        teardown(self.state)

    def __enter__(self) -> NetworkLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
