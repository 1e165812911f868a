"""Raising PeerLost into the thread that runs the training function: at its next Python
operation, never inside a shielded ray_ckpt call, at most once per run of the function, and
never after it returned. Real threads, real asynchronous exceptions."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ray_ckpt.errors import PeerLost
from ray_ckpt.train.interrupts import Interrupts


class Training(threading.Thread):
    """A training function in its own thread: ``body(interrupts, log)`` between arm and disarm,
    as ``InPlaceRecovery.wrap`` runs it; ``log`` records what happened, ``outcome`` how it ended."""

    def __init__(self, interrupts: Interrupts, body: Any) -> None:
        super().__init__(daemon=True)
        self.interrupts, self.body = interrupts, body
        self.log: list[str] = []
        self.outcome = "running"
        self.armed = threading.Event()
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            self.interrupts.arm()
            self.armed.set()
            try:
                self.body(self.interrupts, self.log)
            finally:
                self.interrupts.disarm()
            self.outcome = "returned"
        except PeerLost:
            self.outcome = "PeerLost"
        self.ended_at = time.monotonic()
        time.sleep(0.2)  # a late asynchronous exception would land here
        self.log.append("after")


def compute(seconds: float) -> Any:
    def body(interrupts: Interrupts, log: list[str]) -> None:
        deadline = time.monotonic() + seconds
        total = 0
        while time.monotonic() < deadline:  # a long compute made of short operations
            total += sum(range(100))
        log.append("computed")

    return body


def test_a_fire_interrupts_a_long_compute_at_once() -> None:
    interrupts = Interrupts()
    thread = Training(interrupts, compute(30.0))
    thread.start()
    assert thread.armed.wait(5)
    time.sleep(0.1)
    fired_at = time.monotonic()
    assert interrupts.fire()
    thread.join(10)
    assert thread.outcome == "PeerLost" and thread.log == ["after"]
    assert thread.ended_at - fired_at < 10.0  # not the 30 s the compute would take (a starved run included)
    assert interrupts.fired
    assert not interrupts.fire(), "a second fire in the same run of the function raises nothing"


def test_a_fire_during_a_shielded_call_is_raised_as_the_call_returns() -> None:
    """The shielded call (a save) runs to its end; PeerLost comes right after it, before the
    function's next line."""
    started = threading.Event()
    release = threading.Event()

    def body(interrupts: Interrupts, log: list[str]) -> None:
        with interrupts.shielded():
            started.set()
            with interrupts.shielded():  # nested: the outermost exit raises
                release.wait(10)
                deadline = time.monotonic() + 0.3
                while time.monotonic() < deadline:
                    pass
            log.append("inner done")
        log.append("next line")

    interrupts = Interrupts()
    thread = Training(interrupts, body)
    thread.start()
    assert started.wait(5)
    assert interrupts.fire()
    release.set()
    thread.join(10)
    assert thread.outcome == "PeerLost"
    assert thread.log == ["inner done", "after"]


def test_a_shielded_call_that_begins_after_a_fire_raises_before_its_work() -> None:
    """A function that swallowed PeerLost cannot save into the lost generation."""

    def body(interrupts: Interrupts, log: list[str]) -> None:
        try:
            compute(30.0)(interrupts, log)
        except PeerLost:
            log.append("swallowed")
        with interrupts.shielded():
            log.append("saved")

    interrupts = Interrupts()
    thread = Training(interrupts, body)
    thread.start()
    assert thread.armed.wait(5)
    time.sleep(0.05)
    interrupts.fire()
    thread.join(10)
    assert thread.outcome == "PeerLost" and thread.log == ["swallowed", "after"]


def test_nothing_is_raised_outside_the_function_or_after_it_returned() -> None:
    interrupts = Interrupts()
    assert not interrupts.fire(), "not armed: no thread to interrupt"
    thread = Training(interrupts, lambda interrupts, log: log.append("quick"))
    thread.start()
    thread.join(10)
    assert thread.outcome == "returned"
    assert not interrupts.fire()
    time.sleep(0.3)
    assert thread.log == ["quick", "after"]


def test_a_fire_not_yet_raised_is_withdrawn_when_the_function_ends() -> None:
    """The fake delivery never raises: disarm must withdraw what was sent."""
    sent: list[Any] = []

    def record(thread_id: int, error: Any) -> None:
        sent.append(error)

    interrupts = Interrupts(raise_in=record)
    interrupts.arm()
    assert interrupts.fire()
    interrupts.disarm()
    assert sent == [PeerLost, None]
    interrupts.arm()
    assert not interrupts.fired, "a new run of the function starts unfired"


def test_another_threads_shielded_block_is_not_shielded_and_raises_nothing() -> None:
    interrupts = Interrupts(raise_in=lambda thread_id, error: None)
    interrupts.arm()
    interrupts.fire()
    outcome: list[str] = []

    def other() -> None:
        with interrupts.shielded():
            outcome.append("ran")

    worker = threading.Thread(target=other)
    worker.start()
    worker.join(5)
    assert outcome == ["ran"]
    with pytest.raises(PeerLost), interrupts.shielded():
        outcome.append("not reached")
    assert outcome == ["ran"]
