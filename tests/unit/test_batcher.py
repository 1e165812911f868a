"""Batcher: no added latency when idle, coalescing while a batch is in flight, errors to every caller."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ray_ckpt.core.batcher import Batcher


def test_an_idle_call_is_sent_at_once_alone() -> None:
    sent: list[list[int]] = []
    batcher: Batcher[int, int] = Batcher(lambda items: sent.append(list(items)) or [i * 2 for i in items])
    assert batcher.submit(3) == 6
    assert batcher.submit(4) == 8
    assert sent == [[3], [4]]


def test_calls_made_while_a_batch_is_in_flight_go_together_in_the_next() -> None:
    """The first call holds the line; the 7 that arrive meanwhile go as one batch; each gets its own result."""
    release = threading.Event()
    sent: list[list[int]] = []

    def send(items: list[int]) -> list[int]:
        sent.append(list(items))
        if len(sent) == 1:
            release.wait(5)
        return [i + 100 for i in items]

    batcher: Batcher[int, int] = Batcher(send)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(batcher.submit, 0)
        while not sent:
            time.sleep(0.001)
        rest = [pool.submit(batcher.submit, i) for i in range(1, 8)]
        time.sleep(0.1)  # let them queue
        release.set()
        assert first.result(5) == 100
        assert [f.result(5) for f in rest] == [i + 100 for i in range(1, 8)]
    assert sent[0] == [0] and sorted(sent[1]) == list(range(1, 8)) and len(sent) == 2
    assert batcher.batches == 2


def test_a_failed_send_raises_in_every_caller_of_that_batch_and_the_next_batch_works() -> None:
    calls = []

    def send(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            raise ConnectionError("registry gone")
        return items

    batcher: Batcher[int, int] = Batcher(send)
    with pytest.raises(ConnectionError, match="registry gone"):
        batcher.submit(1)
    assert batcher.submit(2) == 2


def test_a_wrong_number_of_results_is_an_error() -> None:
    batcher: Batcher[int, int] = Batcher(lambda items: [])
    with pytest.raises(RuntimeError, match="a batch of 1 items got 0 results"):
        batcher.submit(1)


def test_many_threads_get_their_own_results() -> None:
    batcher: Batcher[int, int] = Batcher(lambda items: (time.sleep(0.001), [-i for i in items])[1])
    with ThreadPoolExecutor(16) as pool:
        assert list(pool.map(batcher.submit, range(200))) == [-i for i in range(200)]
    assert batcher.batches < 200
