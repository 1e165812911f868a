"""The restore path end to end without Ray: plan, fetch from fake stores with dead, missing and
corrupt shards, decode, load; the local copy, the backup fallback and the world-size check."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch

from ray_ckpt import prefetch
from ray_ckpt.backup import ArrowBackup
from ray_ckpt.core import blob, snapshot
from ray_ckpt.core.checksum import checksum
from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.core.identity import RankIdentity
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.wire import FoundShard, PlanAnswer, RankLocation, RankRecord, RestorePlan
from ray_ckpt.errors import (
    ConfigError,
    InsufficientShardsError,
    RayCkptError,
    ShardsUnreachableError,
    SnapshotFormatError,
)
from ray_ckpt.process_copies import ProcessCopies
from ray_ckpt.restore import Restorer, _SlotLease
from ray_ckpt.save import local_copy_meta
from ray_ckpt.testing import digest

JOB, K, M, WORLD = "job", 3, 2, 2
NODES = [f"n{i}" for i in range(K + M)]


def state_of(rank: int, step: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(rank * 100 + step)
    return {"w": torch.randn(10_000, generator=generator), "b": torch.arange(5) + step, "step": step}


def encode(rank: int, step: int) -> tuple[np.ndarray, list[ShardMeta], list[np.ndarray]]:
    """(the rank's blob, shard metadata, shards) as a save would make them."""
    header, payload = snapshot.snapshot(state_of(rank, step))
    size = blob.blob_size(len(header), payload.size)
    code = ReedSolomon(K, M)
    data = np.zeros(code.shard_size(size) * K, dtype=np.uint8)
    offset = blob.write_prefix(data, header)
    data[offset : offset + payload.size] = payload
    shards = code.encode(data)
    common = {"job": JOB, "step": step, "rank": rank, "world_size": WORLD, "data_shards": K, "parity_shards": M}
    metas = [
        ShardMeta(**common, index=i, payload_size=size, shard_size=s.size, checksum=checksum(s))
        for i, s in enumerate(shards)
    ]
    return data[:size], metas, shards


class FakeStores:
    """Stores as dicts of what each answers on the wire, parsed as ``StoreDirectory`` parses
    it (a malformed answer fails its call with SnapshotFormatError): ``dead`` nodes have none;
    ``failing`` nodes' calls raise."""

    def __init__(self) -> None:
        self.held: dict[str, dict[tuple[str, int, int, int, bool], tuple[dict[str, Any], np.ndarray]]] = {
            n: {} for n in NODES
        }
        self.dead: set[str] = set()
        self.failing: set[str] = set()
        self.silent: set[str] = set()  # alive, but their calls never end (a paused process)
        self.unanswered_into: dict[str, Callable[[], np.ndarray | None] | None] = {}  # silent gets' landing
        self.gets: list[tuple[str, int]] = []
        self.landed = 0  # shards received into the caller's buffer
        self.registry: FakeRegistry | None = None  # answers the plans a node's store relays
        self.plans = 0

    def live(self, node_ids: Iterable[str]) -> set[str]:
        return {n for n in node_ids if n in self.held and n not in self.dead}

    def plan(self, node_id: str, job: str, attempt: str | None, rank: int) -> Future[Any]:
        if node_id in self.dead or self.registry is None:
            raise KeyError(node_id)
        self.plans += 1
        future: Future[Any] = Future()
        plan = self.registry.plan
        located = {} if plan.step is None else {rank: self.registry.locate_rank(job, plan.step, rank)}
        future.set_result(PlanAnswer(plan, located))
        return future

    def get(
        self, node_id: str, address: ShardAddress, into: Callable[[], np.ndarray | None] | None = None
    ) -> Future[Any]:
        """As a direct read: the bytes land in ``into()`` when it fits, unchecked (corrupt ones too)."""
        self.gets.append((node_id, address.index))
        future: Future[Any] = Future()
        if node_id in self.silent:
            self.unanswered_into[node_id] = into
            return future  # never answered
        if node_id in self.failing:
            future.set_exception(RuntimeError("the store's process died"))
        else:
            key = (address.job, address.step, address.rank, address.index, address.local)
            found = self.held[node_id].get(key)
            target = None if found is None or into is None else into()
            if found is not None and target is not None and target.size == found[1].size:
                self.landed += 1
                np.copyto(target, found[1])
                found = (found[0], target)
            try:
                future.set_result(None if found is None else FoundShard.from_wire(found))
            except SnapshotFormatError as malformed:
                future.set_exception(malformed)
        return future


class FakeRegistry:
    """A registry that committed steps 1 and 2 of two ranks, one shard per node."""

    def __init__(self, stores: FakeStores, local_node: str | None = None) -> None:
        self.records: dict[int, dict[int, RankRecord]] = {}
        self.blobs: dict[tuple[int, int], np.ndarray] = {}
        for step in (1, 2):
            self.records[step] = {}
            for rank in range(WORLD):
                body, metas, shards = encode(rank, step)
                self.blobs[(rank, step)] = body
                nodes = {}
                for meta, shard, node in zip(metas, shards, NODES):
                    stores.held[node][(JOB, step, rank, meta.index, False)] = (meta.to_dict(), shard)
                    nodes[meta.index] = node
                local = None
                if local_node is not None:
                    common = {"job": JOB, "step": step, "rank": rank, "world_size": WORLD, "attempt": "", "writer": ""}
                    local = local_copy_meta(body, metas[:K], **common)
                    stores.held.setdefault(local_node, {})[(JOB, step, rank, 0, True)] = (local.to_dict(), body.copy())
                self.records[step][rank] = RankRecord(dict(enumerate(metas)), nodes, local, local_node)
        self.plan = RestorePlan(step=2, source="peers", ever_committed=True, newest_committed=2, newest_staged=3)
        self.plan = RestorePlan(**{**self.plan.to_wire(), "world_size": WORLD})
        self.unrestorable: list[int] = []
        self.rollbacks: list[int] = []
        self.direct_plans = 0
        stores.registry = self

    def plan_restore(self, job: str, attempt: str | None) -> RestorePlan:
        return self.plan

    def plan_for_rank(self, job: str, attempt: str | None, rank: int) -> PlanAnswer:
        self.direct_plans += 1
        located = {} if self.plan.step is None else {rank: self.locate_rank(job, self.plan.step, rank)}
        return PlanAnswer(self.plan, located)

    def locate(self, job: str, step: int) -> dict[int, RankRecord]:
        return self.records[step]

    def locate_rank(self, job: str, step: int, rank: int) -> RankLocation:
        return RankLocation(world_size=len(self.records[step]), record=self.records[step].get(rank))

    def settle_backup_step(self, job: str, attempt: str | None, step: int | None) -> int | None:
        return step

    def mark_unrestorable(self, job: str, step: int) -> None:
        self.unrestorable.append(step)

    def rollback(self, job: str, step: int) -> list[int]:
        self.rollbacks.append(step)
        return []


@pytest.fixture
def pool() -> Iterable[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as executor:
        yield executor


def restorer(registry: Any, stores: Any, pool: ThreadPoolExecutor, **overrides: Any) -> Restorer:
    identity: dict[str, Any] = {"job": JOB, "rank": 1, "world_size": WORLD, "attempt": "a", "node_id": "here"}
    identity.update((name, overrides.pop(name)) for name in list(overrides) if name in identity)
    options: dict[str, Any] = {
        "identity": RankIdentity(**identity),
        "registry": registry,
        "stores": stores,
        "backup": None,
        "copies": ProcessCopies(),
        "background": pool,
        "timeout_s": lambda: 5.0,
        "allocate": lambda n: np.empty(n, dtype=np.uint8),
    }
    return Restorer(**{**options, **overrides})


def test_peers_restore_is_bit_exact_with_a_dead_node_and_a_corrupt_shard(pool: ThreadPoolExecutor) -> None:
    """Data shard 0's node is dead and data shard 1's bytes are flipped (received straight into
    their place in the output buffer, as a direct read does): the restore fetches parity
    instead, decodes over them, and the state is bit-exact step 2 of rank 1."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    stores.dead.add("n0")
    meta, shard = stores.held["n1"][(JOB, 2, 1, 1, False)]
    forged = shard.copy()
    forged[17] ^= 0x40
    stores.held["n1"][(JOB, 2, 1, 1, False)] = (meta, forged)
    restored, plan = restorer(registry, stores, pool).restore()
    assert plan == registry.plan
    assert restored is not None and (restored.step, restored.source) == (2, "peers")
    assert digest(restored.state) == digest(state_of(1, 2))
    assert set(restored.phases_s) == {"locate", "fetch", "decode", "load"}
    assert ("n0", 0) not in stores.gets  # a dead node is never asked
    assert stores.landed == 2  # data shards 1 (corrupt) and 2, in place; parity shards never land there
    assert registry.rollbacks == [] and registry.unrestorable == []


def test_a_failing_store_and_a_missing_shard_are_erasures(pool: ThreadPoolExecutor) -> None:
    """A store whose call raises and a store that no longer holds its shard cost two of the m
    erasures; the restore still succeeds from the other three shards."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    stores.failing.add("n2")
    del stores.held["n3"][(JOB, 2, 1, 3, False)]
    restored, _ = restorer(registry, stores, pool).restore()
    assert restored is not None and digest(restored.state) == digest(state_of(1, 2))


def test_stores_that_answer_malformed_metadata_are_erasures_for_good(pool: ThreadPoolExecutor) -> None:
    """A store whose answer does not parse answered, with nothing usable: an erasure like a bad
    checksum, not a store that did not answer. Two such: the restore succeeds from the other
    three; three: InsufficientShardsError (proof), and the step is given up."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    for node, index in (("n0", 0), ("n1", 1)):
        meta, shard = stores.held[node][(JOB, 2, 1, index, False)]
        stores.held[node][(JOB, 2, 1, index, False)] = ({**meta, "checksum": "forged"}, shard)
    restored, _ = restorer(registry, stores, pool).restore()
    assert restored is not None and digest(restored.state) == digest(state_of(1, 2))
    meta, shard = stores.held["n4"][(JOB, 2, 1, 4, False)]
    stores.held["n4"][(JOB, 2, 1, 4, False)] = ({"job": JOB}, shard)
    with pytest.raises(InsufficientShardsError) as raised:
        restorer(registry, stores, pool).restore()
    assert raised.value.lost == [0, 1, 4]
    assert registry.unrestorable == [2]


def test_more_than_m_erasures_mark_the_step_unrestorable_and_raise(pool: ThreadPoolExecutor) -> None:
    """Three of five shards gone: InsufficientShardsError naming rank, step and lost shards,
    and the registry is told so that no later plan picks the step."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    stores.dead |= {"n0", "n1", "n4"}
    with pytest.raises(InsufficientShardsError) as raised:
        restorer(registry, stores, pool).restore()
    assert (raised.value.rank, raised.value.step, raised.value.lost) == (1, 2, [0, 1, 4])
    assert registry.unrestorable == [2]


def test_stores_that_do_not_answer_in_time_keep_the_step_restorable(pool: ThreadPoolExecutor) -> None:
    """Three of five stores alive but paused (their calls never end within the timeout): too
    few shards are read, but that proves nothing about the step. ShardsUnreachableError names
    the silent shards, the step is not marked unrestorable and no rollback happens; once the
    stores answer again, the next attempt restores step 2 bit-exact."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    stores.silent |= {"n0", "n1", "n4"}
    with pytest.raises(ShardsUnreachableError) as raised:
        restorer(registry, stores, pool, timeout_s=lambda: 0.2).restore()
    assert (raised.value.rank, raised.value.step) == (1, 2)
    assert set(raised.value.unanswered) <= {0, 1, 4} and raised.value.unanswered
    assert registry.unrestorable == [] and registry.rollbacks == []
    stores.silent.clear()
    restored, _ = restorer(registry, stores, pool, attempt="b").restore()
    assert restored is not None and restored.step == 2 and digest(restored.state) == digest(state_of(1, 2))


def test_a_silent_store_whose_node_is_declared_dead_meanwhile_is_routed_around_before_the_timeout(
    pool: ThreadPoolExecutor,
) -> None:
    """Data shard 0's store goes silent (its node lost power or its link: the call never ends),
    and while the restore waits on it Ray declares the node dead (the run fences such a node
    within a second): the restore asks for a parity shard instead at its next liveness check,
    not after its 30 s timeout, and is bit-exact. The silent read, should it ever answer, lands
    in fresh memory, never in the restored state's."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    stores.silent.add("n0")
    declared = threading.Timer(0.3, stores.dead.add, args=("n0",))
    declared.start()
    started = time.monotonic()
    restored, _ = restorer(registry, stores, pool, timeout_s=lambda: 30.0).restore()
    assert time.monotonic() - started < 15.0  # half the timeout: routed around, not waited out
    assert restored is not None and restored.step == 2 and digest(restored.state) == digest(state_of(1, 2))
    assert ("n3", 3) in stores.gets
    late = stores.unanswered_into["n0"]
    assert late is not None and late() is None
    assert registry.unrestorable == [] and registry.rollbacks == []


def test_a_slot_lease_is_taken_back_only_before_its_read_lands() -> None:
    buffer: Future[np.ndarray] = Future()
    buffer.set_result(np.zeros(8, dtype=np.uint8))
    given_up = _SlotLease(buffer, 1, 4)
    assert given_up.revoke() and given_up() is None
    landing = _SlotLease(buffer, 1, 4)
    slot = landing()
    assert slot is not None and slot.size == 4 and not landing.revoke()


def test_failing_calls_to_live_stores_keep_the_step_restorable(pool: ThreadPoolExecutor) -> None:
    """Calls that fail while their store is still listed alive are no proof of loss either:
    ShardsUnreachableError, nothing marked. The same stores listed dead are proof:
    InsufficientShardsError, and the step is given up."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    stores.failing |= {"n0", "n1", "n4"}
    with pytest.raises(ShardsUnreachableError):
        restorer(registry, stores, pool).restore()
    assert registry.unrestorable == []
    stores.dead |= {"n0", "n1", "n4"}
    with pytest.raises(InsufficientShardsError):
        restorer(registry, stores, pool).restore()
    assert registry.unrestorable == [2]


@pytest.mark.parametrize("error", [MemoryError("cannot allocate"), TimeoutError("loaded node"), OSError(12, "ENOMEM")])
def test_a_transient_error_during_a_restore_never_gives_the_step_up(
    pool: ThreadPoolExecutor, error: BaseException
) -> None:
    """An error that says nothing about the step's shards (memory short while the old workers
    exit, a timeout on a loaded node) fails the attempt and leaves the step as it was: the
    registry is not told it is unrestorable, and the next attempt restores it."""
    stores = FakeStores()
    registry = FakeRegistry(stores)

    def allocate(size: int) -> np.ndarray:
        raise error

    with pytest.raises(type(error)):
        restorer(registry, stores, pool, allocate=allocate).restore()
    assert registry.unrestorable == [] and registry.rollbacks == []
    restored, _ = restorer(registry, stores, pool, attempt="b").restore()
    assert restored is not None and digest(restored.state) == digest(state_of(1, 2))


def test_intact_shards_whose_bytes_do_not_load_give_the_step_up(pool: ThreadPoolExecutor) -> None:
    """Proof of loss from the bytes themselves: every shard passes its checksum but the decoded
    blob is not a snapshot (its header was garbage when saved). The step is marked unrestorable."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    record = registry.records[2][1]
    for index, node in record.nodes.items():
        meta, shard = stores.held[node][(JOB, 2, 1, index, False)]
        if index == 0:
            shard = shard.copy()
            shard[:64] = 0xFF  # the blob's prefix and header
            meta = {**meta, "checksum": checksum(shard)}
            record.metas[index] = ShardMeta.from_dict(meta)
            stores.held[node][(JOB, 2, 1, index, False)] = (meta, shard)
    with pytest.raises(RayCkptError):
        restorer(registry, stores, pool).restore()
    assert registry.unrestorable == [2]


def test_the_local_copy_is_used_without_fetching_shards(pool: ThreadPoolExecutor) -> None:
    """A rank whose full copy is on its own node restores it with no shard fetched."""
    stores = FakeStores()
    registry = FakeRegistry(stores, local_node="here")
    restoring = restorer(registry, stores, pool)
    restored, _ = restoring.restore()
    assert restored is not None and restored.source == "local"
    assert digest(restored.state) == digest(state_of(1, 2))
    assert stores.gets == [("here", 0)]
    assert restoring.restored_bytes == registry.blobs[(1, 2)].size


@pytest.mark.parametrize("where", [0, -1], ids=["first byte", "last byte"])
def test_a_corrupt_local_copy_is_refused_and_the_peers_restore_bit_exact(pool: ThreadPoolExecutor, where: int) -> None:
    """The local copy's checksum (of its data shards' checksums, ``checksum_parts``) catches a
    flipped byte anywhere in it, the last part's too; the rank then restores from its peers."""
    stores = FakeStores()
    registry = FakeRegistry(stores, local_node="here")
    _, body = stores.held["here"][(JOB, 2, 1, 0, True)]
    body[where] ^= 0xFF
    restored, _ = restorer(registry, stores, pool).restore()
    assert restored is not None and restored.source == "peers"
    assert digest(restored.state) == digest(state_of(1, 2))


def test_an_older_kept_step_rolls_back_the_newer_commits(pool: ThreadPoolExecutor) -> None:
    """A plan for step 1 while step 2 is the newest commit: step 1 is restored and the registry
    is asked to forget the newer steps."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    registry.plan = RestorePlan(
        step=1, source="peers", ever_committed=True, newest_committed=2, newest_staged=2, world_size=WORLD
    )
    restored, _ = restorer(registry, stores, pool).restore()
    assert restored is not None and digest(restored.state) == digest(state_of(1, 1))
    assert registry.rollbacks == [1]


def test_backup_fallback_reads_the_newest_complete_backup(pool: ThreadPoolExecutor, tmp_path: Any) -> None:
    """Plan "backup": the newest complete backup step is read, checked and loaded."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    backup = ArrowBackup(str(tmp_path))
    for rank in range(WORLD):
        backup.write(JOB, 1, rank, WORLD, registry.blobs[(rank, 1)])
    registry.plan = RestorePlan(source="backup", ever_committed=True, newest_committed=2, newest_staged=2)
    restored, _ = restorer(registry, stores, pool, backup=backup).restore()
    assert restored is not None and (restored.step, restored.source) == (1, "backup")
    assert digest(restored.state) == digest(state_of(1, 1))
    assert registry.rollbacks == [1]


def test_no_backup_after_an_unrebuildable_commit_raises_instead_of_starting_over(pool: ThreadPoolExecutor) -> None:
    """Plan "backup" with no backup configured: InsufficientShardsError, never None."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    stores.dead |= set(NODES)
    registry.plan = RestorePlan(source="backup", ever_committed=True, newest_committed=2, newest_staged=2)
    with pytest.raises(InsufficientShardsError, match="backup_uri is not set"):
        restorer(registry, stores, pool).restore()


@pytest.mark.parametrize("world_size", [1, 3])
def test_another_world_size_raises_the_same_config_error(pool: ThreadPoolExecutor, world_size: int) -> None:
    """A step saved by 2 ranks restored by 1 or 3: ConfigError naming both sizes; nothing fetched."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    with pytest.raises(ConfigError, match=f"saved by 2 rank.*world size {world_size}") as raised:
        restorer(registry, stores, pool, rank=0, world_size=world_size).restore()
    assert (raised.value.saved_world_size, raised.value.world_size) == (2, world_size)
    assert stores.gets == []


def test_the_plan_comes_through_the_nodes_store_or_from_the_registry_when_that_store_is_gone(
    pool: ThreadPoolExecutor,
) -> None:
    """A rank asks its node's store for the plan and its record (one relayed call for the node's
    ranks); with that store gone it asks the registry itself, and restores the same."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    through_store, _ = restorer(registry, stores, pool).restore()
    assert (stores.plans, registry.direct_plans) == (1, 0)
    stores.dead.add("here")
    direct, _ = restorer(registry, stores, pool).restore()
    assert (stores.plans, registry.direct_plans) == (1, 1)
    assert through_store is not None and direct is not None
    assert digest(through_store.state) == digest(direct.state) == digest(state_of(1, 2))


@pytest.mark.parametrize("step", [True, 1.9, 2.0, -1, 2**64, "2"])
def test_a_step_that_is_not_an_int_from_0_to_step_max_is_refused_before_anything_is_read(
    pool: ThreadPoolExecutor, step: Any
) -> None:
    """``restore(step=True)`` restored step 1 (True == 1) and 1.9 went to the registry; now both,
    like a negative or too large step, are a ConfigError naming the accepted values."""
    stores = FakeStores()
    registry = FakeRegistry(stores)
    with pytest.raises(ConfigError, match=r"step must be an int in \[0, 2\*\*63\)"):
        restorer(registry, stores, pool).restore(step)
    assert stores.gets == [] and stores.plans == 0


@pytest.mark.parametrize("given_up", [True, False], ids=["buffer-given-up", "buffer-still-written"])
def test_a_rollback_in_the_saving_process_takes_the_step_from_its_own_buffer(
    pool: ThreadPoolExecutor, given_up: bool
) -> None:
    """An in-place survivor: its save pipeline still holds step 2's blob. The restore takes it
    without asking any store, bit-exact, whether its pipeline gave the buffer up or still writes
    it (then ``take`` copies it, see test_own_copies.py)."""
    stores = FakeStores()
    registry = FakeRegistry(stores, local_node="here")
    buffer = registry.blobs[(1, 2)].copy()
    pipeline, copies = object(), ProcessCopies()
    copies.own_copies.note(JOB, 1, 2, "", buffer, pipeline)
    if given_up:
        copies.own_copies.orphan(pipeline)
    restoring = restorer(registry, stores, pool, copies=copies)
    restored, _ = restoring.restore()
    assert restored is not None and (restored.step, restored.source) == (2, "local")
    assert digest(restored.state) == digest(state_of(1, 2))
    assert stores.gets == [], "no store was asked"
    assert restoring.restored_bytes == buffer.size, "counted (the next save's buffer is mapped to that size)"
    assert copies.own_copies.take(JOB, 1, 2, "") is None, "taken once"


@pytest.mark.parametrize("held", ["corrupt", "other-writer", "other-step", "dropped"])
def test_a_held_blob_that_is_not_the_planned_steps_intact_copy_is_not_used(pool: ThreadPoolExecutor, held: str) -> None:
    """A flipped byte, another writer's or another step's blob, or one dropped at close: the
    restore reads the node's store instead, bit-exact."""
    stores = FakeStores()
    registry = FakeRegistry(stores, local_node="here")
    buffer = registry.blobs[(1, 2)].copy()
    if held == "corrupt":
        buffer[-1] ^= 0xFF
    pipeline, copies = object(), ProcessCopies()
    step, writer = (1, "") if held == "other-step" else (2, "w2" if held == "other-writer" else "")
    copies.own_copies.note(JOB, 1, step, writer, buffer, pipeline)
    if held == "dropped":
        copies.own_copies.drop(pipeline)
    restoring = restorer(registry, stores, pool, copies=copies)
    restored, _ = restoring.restore()
    assert restored is not None and restored.source == "local"
    assert digest(restored.state) == digest(state_of(1, 2))
    assert stores.gets == [("here", 0)]
    assert restoring.restored_bytes == buffer.size


@pytest.fixture
def copies() -> Iterable[ProcessCopies]:
    """A process's copies of the test's own, its reads ahead dropped at the end."""
    copies = ProcessCopies()
    yield copies
    copies.reads_ahead.clear()


def test_a_replacements_read_ahead_is_the_planned_steps_blob_and_its_restore_asks_no_store_again(
    pool: ThreadPoolExecutor, copies: ProcessCopies
) -> None:
    stores = FakeStores()
    registry = FakeRegistry(stores)
    planned = restorer(registry, stores, pool).read_planned()
    assert planned is not None and planned[0] == 2 and planned[1] == registry.records[2][1]
    assert bytes(planned[2]) == bytes(registry.blobs[(1, 2)])
    reads = len(stores.gets)
    copies.reads_ahead.begin("a", 1, lambda: [JOB], lambda job: planned)
    restored, _ = restorer(registry, stores, pool, copies=copies).restore()
    assert restored is not None and (restored.step, restored.source) == (2, "peers")
    assert digest(restored.state) == digest(state_of(1, 2))
    assert len(stores.gets) == reads, "the restore read nothing more"
    assert copies.reads_ahead.claim(JOB, "a", 1) is None, "claimed once"


@pytest.mark.parametrize("read", ["other-step", "failed", "other-job", "other-attempt"])
def test_a_read_ahead_that_is_not_the_restores_own_is_not_used(
    pool: ThreadPoolExecutor, copies: ProcessCopies, read: str
) -> None:
    """A read of another step (the plan moved on), one that failed, or one begun for another
    job or attempt: the restore reads from peers itself, bit-exact."""
    stores = FakeStores()
    registry = FakeRegistry(stores)

    def ahead(job: str) -> prefetch.Planned | None:
        if read == "failed":
            raise RuntimeError("a store died during the read")
        return 1, registry.records[1][1], registry.blobs[(1, 1)]

    jobs = ["x" if read == "other-job" else JOB]
    copies.reads_ahead.begin("b" if read == "other-attempt" else "a", 1, lambda: jobs, ahead)
    restored, _ = restorer(registry, stores, pool, copies=copies).restore()
    assert restored is not None and restored.step == 2 and digest(restored.state) == digest(state_of(1, 2))
    assert len(stores.gets) >= K, "read from peers"


def test_nothing_is_read_ahead_where_the_local_copy_is_on_this_node_or_the_plan_is_a_backup(
    pool: ThreadPoolExecutor,
) -> None:
    stores = FakeStores()
    assert restorer(FakeRegistry(stores, local_node="here"), stores, pool).read_planned() is None
    registry = FakeRegistry(stores)
    registry.plan = RestorePlan(step=None, source="backup", ever_committed=True, newest_committed=2, newest_staged=2)
    assert restorer(registry, stores, pool).read_planned() is None
    assert stores.gets == []
