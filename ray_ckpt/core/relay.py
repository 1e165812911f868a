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
store to its children, fire and forget; a child with no store now (killed, its successor not
registered yet) is passed over, the next store of its run taking its place. The registry's one
hop is checked (``announce``): a root that does not take the commit in time (dead, stuck) is
passed over too, the commit going to the first store of the live stores looked up again, so
the stores that hold no rank (which learn evictions from commits alone) still evict. A store
also learns the kept steps of its job from every stage result (``GroupResult.keep_steps``), so
a commit lost with a failed relay is made up by the next stage round.

**Restore plans** climb the same tree after a restart: every rank asks its node's store for
its attempt's plan and its record (``PlanQuery``); the queries of one job and attempt merge on
the way up, and the answers (``PlanAnswer``) split on the way down, so the registry answers a
few calls however many ranks restart. Pure: no Ray import.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar

from ray_ckpt.core.batcher import Batcher


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


def reachable_part(run: Sequence[str], reachable: Callable[[str], bool]) -> list[str] | None:
    """The part of a child's ``run`` a commit is handed to: the run from its first reachable
    store on (the stores before it, gone, are passed over, so the stores below them are still
    placed), or None when no store of the run is reachable."""
    for first, node_id in enumerate(run):
        if reachable(node_id):
            return list(run[first:])
    return None


def announce(
    members: Sequence[str], deliver: Callable[[list[str]], bool], refresh: Callable[[], Iterable[str]]
) -> list[str] | None:
    """Hand a commit to the root of a tree over ``members`` (the live stores as last looked up,
    sorted): ``deliver(tree)`` sends it to ``tree[0]`` with ``tree`` and says whether that store
    took it within its bound. A store that did not (dead, stuck) is passed over: ``refresh()``
    names the stores to try now (the live stores looked up again; none to give up), and the
    commit goes to the first of them that has not failed this commit, with the rest of them as
    its tree. Returns the tree the commit went down, or None when no store took it."""
    failed: set[str] = set()
    tree = list(members)
    while tree:
        if deliver(tree):
            return tree
        failed.add(tree[0])
        tree = [node for node in sorted(refresh()) if node not in failed]
    return None


class _Item(Protocol):
    """What a relay passes up: items with the same ``key`` merge; ``ranks`` say whose they are."""

    @property
    def key(self) -> Hashable: ...

    @property
    def ranks(self) -> Sequence[int]: ...


class _Answer(Protocol):
    def for_ranks(self, ranks: Iterable[int]) -> _Answer: ...


Item = TypeVar("Item", bound=_Item)
Answer = TypeVar("Answer", bound=_Answer)


class Relay(Generic[Item, Answer]):
    """Concurrent callers' items (stage groups, plan queries) merged into one ``send`` at a
    time; each caller gets the answers to its own items, in order, as seen by its ranks.
    ``merge(items)`` joins items of the same key (one per key, in first-seen order); ``send``
    must return one answer per merged item, in order; if it raises, every caller of that send
    gets the error. Thread-safe."""

    def __init__(
        self, send: Callable[[list[Item]], Sequence[Answer]], merge: Callable[[Iterable[Item]], list[Item]]
    ) -> None:
        self._send, self._merge = send, merge
        self._batcher: Batcher[list[Item], list[Answer]] = Batcher(self._flush)

    @property
    def sends(self) -> int:
        """Calls made so far."""
        return self._batcher.batches

    def submit(self, items: list[Item], linger_s: float = 0.0) -> list[Answer]:
        """The answers to ``items``, from the send they went in (see ``Batcher.submit``)."""
        return self._batcher.submit(items, linger_s)

    def _flush(self, batches: list[list[Item]]) -> list[list[Answer]]:
        merged = self._merge(item for batch in batches for item in batch)
        answers = self._send(merged)
        if len(answers) != len(merged):
            raise RuntimeError(f"a relay of {len(merged)} items got {len(answers)} answers back")
        by_key = {item.key: answer for item, answer in zip(merged, answers)}
        return [[by_key[item.key].for_ranks(item.ranks) for item in batch] for batch in batches]  # type: ignore[misc]
