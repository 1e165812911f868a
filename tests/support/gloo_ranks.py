"""Spawned rank processes of the DTensor tests: each joins a gloo group, does its work, and ends
cleanly (``run_rank``); ``spawn_ranks`` starts them and gathers what they found."""

from __future__ import annotations

import gc
import multiprocessing
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


def spawn_ranks(world: int, store_path: str, work: Any, *args: Any) -> list[Any]:
    """Run ``work(rank, world, results, *args)`` in ``world`` spawned processes (``run_rank``, a
    FileStore at ``store_path``) and assert that each exited 0; what the ranks put on the
    results queue, in rank order (each result is its rank, or a tuple that starts with it)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    procs = [
        context.Process(target=run_rank, args=(rank, world, store_path, results, work, *args)) for rank in range(world)
    ]
    for proc in procs:
        proc.start()
    try:
        outcome = sorted((results.get(timeout=240) for _ in procs), key=lambda r: r if isinstance(r, int) else r[0])
    finally:
        for proc in procs:
            proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0] * world
    return outcome
