"""The body of a spawned rank process of the DTensor tests: a gloo group, the work, a clean end."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any, NoReturn

import torch.distributed as dist


def run_rank(rank: int, world: int, store_path: str, results: Any, work: Any, *args: Any) -> NoReturn:
    """Join a ``world``-rank gloo group over a FileStore, run ``work(rank, world, results,
    *args)`` (it puts what it found on the ``results`` queue), and end the process.

    A rank whose work raised destroys its group and exits 1. One whose work is done tears the
    group down once every rank got there, hands its results over and exits 0 without the
    interpreter's teardown: torch's native exit-time destructors have aborted such a process
    (SIGABRT, "terminate called without an active exception", no Python frame) after its
    results were sent, which would fail a test whose every check passed. tests/conftest.py ends
    the pytest process the same way.
    """
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        work(rank, world, results, *args)
    except BaseException:
        dist.destroy_process_group()
        raise
    dist.barrier()
    gc.collect()  # DTensors' meshes hold the group: free them while the interpreter is whole
    dist.destroy_process_group()
    results.close()
    results.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
