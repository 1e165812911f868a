"""NodeCrasher: runs on one node and crashes it, the way a machine crash looks to Ray.

``crash`` SIGKILLs the node's raylet and every process under it (workers, the dashboard and
runtime-env agents), then itself: nobody gets to shut down, unregister or say goodbye, so Ray
learns of the death only through missed health checks. ray_ckpt.tools.chaos places one per victim
node (``NodeAffinitySchedulingStrategy(node_id, soft=False)``) and fires them together. When a
victim's raylet runs on the host of the process that kills (simulated clusters), that process
finds it with ``local_raylets`` and calls ``kill_tree(..., kill_self=False)`` itself: the same
SIGKILLs, without the second or so a new worker process takes to start.

This module imports neither ray_ckpt nor torch, so the actor starts in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from typing import Any

import psutil
import ray

RAYLET_NAME = "raylet"
_MAX_ANCESTORS = 8  # the raylet is a worker's parent; allow for wrappers in between
_TREE_PASSES = 3  # re-list the raylet's descendants to catch processes forked meanwhile


def is_raylet(process: psutil.Process, node_id: str) -> bool:
    """Whether ``process`` is the raylet of node ``node_id``: its executable is named ``raylet``
    and its command line carries ``--node_id=<node_id>`` (so on a host that runs several
    simulated nodes, only the right one matches)."""
    try:
        name = process.name()
        cmdline = process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    executable = os.path.basename(cmdline[0]) if cmdline else ""
    return RAYLET_NAME in (name, executable) and f"--node_id={node_id}" in cmdline


def find_raylet(node_id: str) -> psutil.Process:
    """The raylet of ``node_id`` on this host: first up this process's parent chain (a Ray
    worker is the raylet's child), else among all processes of the host."""
    process: psutil.Process | None = psutil.Process()
    for _ in range(_MAX_ANCESTORS):
        process = process.parent() if process is not None else None
        if process is None:
            break
        if is_raylet(process, node_id):
            return process
    for candidate in psutil.process_iter():
        if is_raylet(candidate, node_id):
            return candidate
    raise RuntimeError(
        f"no raylet process of node {node_id} found on host {socket.gethostname()} "
        f"(looked for a process named {RAYLET_NAME!r} with --node_id={node_id} in its command line)"
    )


def local_raylets() -> dict[str, psutil.Process]:
    """node id -> raylet process, for every raylet on this host whose command line carries
    ``--node_id=`` and that this process may signal (one scan of the host's processes)."""
    found: dict[str, psutil.Process] = {}
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info.get("cmdline") or []
        executable = os.path.basename(cmdline[0]) if cmdline else ""
        if RAYLET_NAME not in (process.info.get("name"), executable):
            continue
        node_ids = [arg.split("=", 1)[1] for arg in cmdline if arg.startswith("--node_id=")]
        try:
            os.kill(process.pid, 0)
        except OSError:  # gone, or another user's
            continue
        if len(node_ids) == 1:
            found[node_ids[0]] = process
    return found


def kill_tree(raylet: psutil.Process, *, kill_self: bool = True) -> None:
    """SIGKILL every descendant of ``raylet`` (except this process), then the raylet, then this
    process unless ``kill_self`` is False. The raylet is stopped (SIGSTOP) first so it can
    neither start new processes nor report its workers' deaths while they are being killed."""
    me = os.getpid()
    with contextlib.suppress(psutil.NoSuchProcess):
        raylet.send_signal(signal.SIGSTOP)
    killed: set[int] = set()
    for _ in range(_TREE_PASSES):
        try:
            tree = raylet.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        fresh = [p for p in tree if p.pid != me and p.pid not in killed]
        if not fresh:
            break
        for process in fresh:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
            killed.add(process.pid)
    with contextlib.suppress(psutil.NoSuchProcess):
        raylet.kill()
    if kill_self:
        os.kill(me, signal.SIGKILL)


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class NodeCrasher:
    """Armed on creation (finds and checks the raylet), fired by ``crash``. Never restarted: a
    crash kills it along with the node."""

    def __init__(self, node_id: str) -> None:
        here = ray.get_runtime_context().get_node_id()
        if here != node_id:
            raise RuntimeError(f"NodeCrasher for node {node_id} was placed on node {here}")
        self._node_id = node_id
        self._raylet = find_raylet(node_id)
        os.kill(self._raylet.pid, 0)  # PermissionError now rather than a silent failure later
        self._fired = False

    def describe(self) -> dict[str, Any]:
        return {
            "node_id": self._node_id,
            "host": socket.gethostname(),
            "raylet_pid": self._raylet.pid,
            "pid": os.getpid(),
        }

    def crash(self, delay_s: float) -> float:
        """Crash the node ``delay_s`` seconds from now (long enough for this reply to get out);
        returns that time (Unix seconds, this host's clock)."""
        at = time.time() + max(0.0, delay_s)
        if not self._fired:
            self._fired = True
            threading.Thread(target=self._crash_at, args=(at,), name="node-crasher", daemon=True).start()
        return at

    def _crash_at(self, at: float) -> None:
        time.sleep(max(0.0, at - time.time()))
        kill_tree(self._raylet)
