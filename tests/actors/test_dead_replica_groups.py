"""``_ray_compat._dead_groups`` on real actors: the controller's sweep for replica groups whose
worker died with a failing one but whose poll had not failed yet."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from support import pace
from support.killed_actors import wait_until_dead

from ray_ckpt import _ray_compat


@pytest.fixture
def local_ray(ray_tmpdir: str) -> Iterator[None]:
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@ray.remote(num_cpus=0)
class TrainWorker:
    """Answers the call Ray Train's replacement makes (``clear_result_queue``), after ``delay_s``."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s

    def clear_result_queue(self) -> bool:
        time.sleep(self.delay_s)
        return False


class Worker:
    def __init__(self, actor: Any) -> None:
        self.actor = actor


class Group:
    def __init__(self, *actors: Any, active: bool = True) -> None:
        self.workers, self.active = [Worker(actor) for actor in actors], active

    def is_active(self) -> bool:
        return self.active

    def get_workers(self) -> list[Worker]:
        return self.workers


def test_a_group_whose_actor_was_killed_is_found_dead_and_live_failing_or_slow_ones_are_not(local_ray: None) -> None:
    live, killed, failing, inactive = (TrainWorker.remote() for _ in range(4))
    slow = TrainWorker.remote(delay_s=120.0)
    ray.get([a.clear_result_queue.remote() for a in (live, killed, failing, inactive)])
    ray.kill(killed, no_restart=True)
    ray.kill(inactive, no_restart=True)
    wait_until_dead(killed.clear_result_queue.remote, "the killed actor")
    groups = [Group(live), Group(killed), Group(failing), Group(slow), Group(inactive, active=False)]
    started = time.monotonic()
    assert _ray_compat._dead_groups(groups, failing={2}, timeout_s=pace.bound(5.0)) == {1}
    assert time.monotonic() - started < 60.0  # the slow worker was given up on at the timeout, not waited for
