"""Stage relays: the tree of stores that carries stages up to the registry and commits down.

A rank stages through the store of its node; the stores pass stages on along a tree over all
live stores, so the registry takes a few calls per step however many nodes the job has, and
sends each commit to one store instead of to every one.

**The tree** is drawn by the registry over the live stores sorted by node id: with every commit
it hands the root (the first) the whole sorted list and the fan-in (RAY_CKPT_RELAY_FANIN). A
store handed a list that starts with itself keeps the sender as its parent and splits the rest
into at most ``fanin`` contiguous runs (``subtrees``), handing each run, with the commit, to
the run's first store. A parent's node id is smaller than its children's in every list, so
however stale a store's view, stages climb without cycles. A store that has not been handed
its place yet, whose parent failed, or that is the root sends to the registry itself (what
every store did before relays existed).

**Up**: a store merges its ranks' stages and its children's groups (``StageGroup.merged``:
one group per step and attempt, their packed parts side by side) into one call at a time
(``Relay``, a ``Batcher``), and splits the results back per caller. A call retried after a
relay failed is safe: the registry acknowledges stages it holds already (``Registry``).

**Down**: the commit (job, step, kept steps) goes from the registry to the root and from each
store to its children, fire and forget. A store also learns the kept steps of its job from
every stage result (``GroupResult.keep_steps``), so a commit lost with a failed relay is made
up by the next stage round. Pure: no Ray import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ray_ckpt.batcher import Batcher
from ray_ckpt.wire import GroupResult, StageGroup


def subtrees(members: Sequence[str], fanin: int) -> list[list[str]]:
    """The children's runs of a store handed ``members`` (itself first): the rest of the list
    in at most ``fanin`` contiguous runs of near-equal length, each led by its child."""
    if fanin < 1:
        raise ValueError(f"fanin must be >= 1, got {fanin}")
    rest = list(members[1:])
    count = min(fanin, len(rest))
    runs, start = [], 0
    for i in range(count):
        end = start + (len(rest) - start) // (count - i)
        runs.append(rest[start:end])
        start = end
    return runs


class Relay:
    """Concurrent callers' stage groups merged into one ``send`` at a time; each caller gets the
    results of its own groups, in order. ``send(groups)`` must return one ``GroupResult`` per
    group, in order; if it raises, every caller of that send gets the error. Thread-safe."""

    def __init__(self, send: Callable[[list[StageGroup]], Sequence[GroupResult]]) -> None:
        self._send = send
        self._batcher: Batcher[list[StageGroup], list[GroupResult]] = Batcher(self._flush)

    @property
    def sends(self) -> int:
        """Calls made so far."""
        return self._batcher.batches

    def submit(self, groups: list[StageGroup], linger_s: float = 0.0) -> list[GroupResult]:
        """The results of ``groups``, from the send they went in (see ``Batcher.submit``)."""
        return self._batcher.submit(groups, linger_s)

    def _flush(self, items: list[list[StageGroup]]) -> list[list[GroupResult]]:
        merged = StageGroup.merged(group for item in items for group in item)
        results = self._send(merged)
        if len(results) != len(merged):
            raise RuntimeError(f"a relay of {len(merged)} stage groups got {len(results)} results back")
        by_key = {group.key: result for group, result in zip(merged, results)}
        return [[by_key[group.key].for_ranks(group.ranks) for group in item] for item in items]
