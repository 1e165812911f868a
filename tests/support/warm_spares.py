"""The warm spares in-place recovery keeps: which idle, warmed-up worker processes sit on which
node (read from the machine's processes, as the in-place cluster tests check them)."""

from __future__ import annotations

import collections
import time

import psutil
import ray

from ray_ckpt import _ray_compat
from ray_ckpt.train import inplace


def idle_warm_spares(since: float) -> collections.Counter[str]:
    """How many processes started after ``since`` with in-place recovery's warm-up hook sit idle
    and warm on each node: Ray titles an idle worker ``ray::IDLE`` as soon as it connects,
    before the hook's imports, so a process counts once its CPU time stands still for half a
    second (its parent is its node's raylet)."""
    sockets = {str(n["RayletSocketName"]): str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")}
    idle: dict[psutil.Process, tuple[str, float]] = {}
    for process in psutil.process_iter():
        try:
            if process.environ().get(_ray_compat.SETUP_HOOK_ENV_VAR) != inplace.WARM_HOOK:
                continue
            parent = process.parent()
            if process.cmdline()[:1] != ["ray::IDLE"] or parent is None or process.create_time() < since:
                continue
            raylet = next(a.split("=", 1)[1] for a in parent.cmdline() if a.startswith("--raylet_socket_name="))
            if raylet in sockets:
                idle[process] = (sockets[raylet], sum(process.cpu_times()[:2]))
        except (psutil.Error, OSError, StopIteration):
            continue
    time.sleep(0.5)
    nodes: collections.Counter[str] = collections.Counter()
    for process, (node, cpu_s) in idle.items():
        try:
            if sum(process.cpu_times()[:2]) - cpu_s < 0.02:
                nodes[node] += 1
        except psutil.Error:
            continue
    return nodes
