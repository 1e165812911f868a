"""The commit protocol under generated interleavings (docs/commit-protocol.md): hypothesis drives
``protocol_sim.World`` (the real registry, stores and restore path, no Ray) through saves, torn
and abandoned saves, ranks that skip steps others save and wait for their last one, restores,
node losses beyond m, store and registry restarts, stores that stop answering while alive and
restores short of memory (transient errors: a step is given up only on proof), outside readers
that read the newest committed step while the job runs (and must change nothing), incarnations with
and without an attempt or a restore, and checks every invariant after each event.
``scripts/protocol_campaign.py`` runs the same machine longer."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support.protocol_sim import World

NODES = 5
EXAMPLES = int(os.environ.get("RAY_CKPT_PROTOCOL_EXAMPLES", "2000"))
STEPS = int(os.environ.get("RAY_CKPT_PROTOCOL_STEPS", "40"))


def _node_event(name: str, doc: str | None = None) -> Any:
    """A rule that applies the ``World``'s event ``name`` to one of the nodes."""

    def event(self: CommitProtocol, node: int) -> None:
        getattr(self.world, name)(f"n{node}")

    event.__name__ = event.__qualname__ = name  # hypothesis names the rule by it in a trace
    event.__doc__ = doc
    return rule(node=st.integers(0, NODES - 1))(event)


def _world_event(name: str, doc: str | None = None) -> Any:
    """A rule that applies the ``World``'s event ``name`` (no argument)."""

    def event(self: CommitProtocol) -> None:
        getattr(self.world, name)()

    event.__name__ = event.__qualname__ = name
    event.__doc__ = doc
    return rule()(event)


class CommitProtocol(RuleBasedStateMachine):
    """One job of 2 or 3 ranks, RS(2,1) or RS(2,2), on 5 simulated nodes."""

    world: World

    @initialize(
        world_size=st.integers(2, 3),
        parity=st.integers(1, 2),
        with_attempt=st.booleans(),
        restores_first=st.booleans(),
        seed=st.integers(0, 2**16),
    )
    def start(self, world_size: int, parity: int, with_attempt: bool, restores_first: bool, seed: int) -> None:
        self.world = World(nodes=NODES, world_size=world_size, k=2, m=parity, seed=seed)
        self.world.start_incarnation(with_attempt=with_attempt, restores_first=restores_first)

    def _pick(self, processes: list, index: int):  # type: ignore[no-untyped-def]
        return processes[index % len(processes)]

    @precondition(lambda self: any(self.world.may_restore(p) for p in self.world.live()))
    @rule(index=st.integers(0, 8))
    def restore(self, index: int) -> None:
        self.world.restore(self._pick([p for p in self.world.live() if self.world.may_restore(p)], index))

    @precondition(lambda self: any(self.world.may_put(p) for p in self.world.live()))
    @rule(index=st.integers(0, 8))
    def put(self, index: int) -> None:
        self.world.put(self._pick([p for p in self.world.live() if self.world.may_put(p)], index))

    @precondition(lambda self: any(self.world.may_train(p) for p in self.world.live()))
    @rule(index=st.integers(0, 8))
    def skip(self, index: int) -> None:
        """A rank trains a step it does not save (another interval, or busy)."""
        self.world.skip(self._pick([p for p in self.world.live() if self.world.may_train(p)], index))

    @precondition(lambda self: any(p.alive and p.last_staged is not None for p in self.world.processes))
    @rule(index=st.integers(0, 8))
    def wait_settled(self, index: int) -> None:
        """A rank, live or a zombie, waits for its newest staged step."""
        waiting = [p for p in self.world.processes if p.alive and p.last_staged is not None]
        self.world.wait_settled(self._pick(waiting, index))

    @precondition(lambda self: any(p.pending is not None for p in self.world.processes if p.alive))
    @rule(index=st.integers(0, 8))
    def stage(self, index: int) -> None:
        """A pending stage arrives: a live rank's, or a zombie's abandoned save still running."""
        self.world.stage(self._pick([p for p in self.world.processes if p.alive and p.pending is not None], index))

    @precondition(lambda self: bool(self.world.live()))
    @rule()
    def train_a_step(self) -> None:
        """Every live rank restores if it is yet to, then saves its next step completely (the
        common case, so that runs make progress)."""
        for process in self.world.live():
            if self.world.may_restore(process):
                self.world.restore(process)
        for process in self.world.live():
            if self.world.may_put(process):
                self.world.put(process)
                self.world.stage(process)

    @rule(with_attempt=st.booleans(), restores_first=st.booleans())
    def new_incarnation(self, with_attempt: bool, restores_first: bool) -> None:
        self.world.start_incarnation(with_attempt=with_attempt, restores_first=restores_first)

    @rule(rank=st.integers(0, 2))
    def outside_read(self, rank: int) -> None:
        """An evaluation sidecar reads a rank's newest committed step while the job runs."""
        self.world.read(rank % self.world.world_size)

    kill_node = _node_event("kill_node")
    revive_node = _node_event("revive_node")
    restart_store = _node_event("restart_store")
    pause_store = _node_event("pause_store", "A store stops answering while alive (a frozen process): slow, not dead.")
    resume_store = _node_event("resume_store")
    run_short_of_memory = _world_event(
        "run_short_of_memory", "The next restore fails with MemoryError (the old workers still exiting)."
    )
    restart_registry = _world_event("restart_registry")
    push_marks = _world_event("push_marks")

    @invariant()
    def protocol_holds(self) -> None:
        self.world.check()

    def teardown(self) -> None:
        self.world.pool.shutdown()


CommitProtocol.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_the_commit_protocol_holds_under_generated_interleavings = CommitProtocol.TestCase
