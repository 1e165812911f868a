"""ShardStore: owned copies, a hard memory budget (also under concurrent puts), scoped eviction."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from ray_ckpt import settings
from ray_ckpt.core import store as store_module
from ray_ckpt.core.checksum import checksum
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.store import ShardStore
from ray_ckpt.errors import ConfigError, StoreFullError

UNLIMITED = 1 << 40


def meta(job: str = "job", step: int = 1, rank: int = 0, index: int = 0, size: int = 64) -> ShardMeta:
    """Metadata of a ``size``-byte shard (k=1, so the shard is the whole payload)."""
    return ShardMeta(
        job=job,
        step=step,
        rank=rank,
        index=index,
        world_size=8,
        data_shards=1,
        parity_shards=3,
        payload_size=size,
        shard_size=size,
        checksum=12345,
    )


def data(size: int, fill: int = 7) -> np.ndarray:
    return np.full(size, fill, dtype=np.uint8)


def cost(m: ShardMeta) -> int:
    """The bytes a store charges for holding shard ``m`` (data plus its metadata record)."""
    probe = ShardStore(node_id="probe", budget_bytes=UNLIMITED)
    probe.put(m, data(m.shard_size))
    return int(probe.stats().used_bytes)


def test_put_keeps_its_own_copy() -> None:
    """Mutating the caller's buffer after put does not change the stored bytes (numpy and bytearray)."""
    store = ShardStore(node_id="n1", budget_bytes=UNLIMITED)
    array = np.arange(64, dtype=np.uint8)
    raw = bytearray(b"x" * 64)
    store.put(meta(index=0), array)
    store.put(meta(index=1), raw)
    array[:] = 0
    raw[:] = b"y" * 64
    got_array = store.get(ShardAddress("job", 1, 0, 0))
    got_raw = store.get(ShardAddress("job", 1, 0, 1))
    assert got_array is not None and got_raw is not None
    assert np.array_equal(got_array[1], np.arange(64, dtype=np.uint8))
    assert got_raw[1].tobytes() == b"x" * 64
    assert not np.shares_memory(got_array[1], array)
    assert got_array[0] == meta(index=0)


def test_get_returns_none_for_absent_shards() -> None:
    """get answers None for any key component that does not match a held shard."""
    store = ShardStore(node_id="n1", budget_bytes=UNLIMITED)
    store.put(meta(), data(64))
    assert store.get(ShardAddress("job", 1, 0, 0)) is not None
    for key in [("other", 1, 0, 0), ("job", 2, 0, 0), ("job", 1, 1, 0), ("job", 1, 0, 1)]:
        assert store.get(ShardAddress(*key)) is None


def test_put_with_wrong_size_raises_and_stores_nothing() -> None:
    """A buffer whose length disagrees with meta.shard_size is refused with ValueError."""
    store = ShardStore(node_id="n1", budget_bytes=UNLIMITED)
    with pytest.raises(ValueError, match="63 bytes"):
        store.put(meta(size=64), data(63))
    assert store.stats().shards == 0
    assert store.get(ShardAddress("job", 1, 0, 0)) is None


def test_negative_budget_is_rejected() -> None:
    """A store cannot be created with a negative budget."""
    with pytest.raises(ValueError, match="budget_bytes"):
        ShardStore(node_id="n1", budget_bytes=-1)


def test_put_over_budget_raises_explains_and_changes_nothing() -> None:
    """StoreFullError names used/budget bytes, the jobs, how to raise the budget; state is unchanged."""
    a, b = meta(job="alpha", index=0, size=100), meta(job="beta", index=1, size=100)
    big, small = meta(job="alpha", step=2, size=1000), meta(job="gamma", step=3, size=10)
    budget = cost(a) + cost(b) + cost(small)
    store = ShardStore(node_id="n1", budget_bytes=budget)
    store.put(a, data(100, 1))
    store.put(b, data(100, 2))
    before = store.stats()
    inventory = store.inventory()
    with pytest.raises(StoreFullError) as caught:
        store.put(big, data(1000))
    error = caught.value
    used = cost(a) + cost(b)
    message = str(error)
    assert f"{used} of {budget} bytes used" in message
    assert "'alpha'" in message and "'beta'" in message
    assert "store_budget_bytes" in message and "RAY_CKPT_STORE_BUDGET_FRACTION" in message
    assert (error.used_bytes, error.budget_bytes, error.requested_bytes) == (used, budget, cost(big))
    assert error.node_id == "n1"
    assert store.stats() == before
    assert store.inventory() == inventory
    assert store.get(ShardAddress("alpha", 2, 0, 0)) is None
    # still serving: reads work and a put that fits succeeds (a third job's, within its fair
    # share of a third), filling the budget exactly
    held = store.get(ShardAddress("beta", 1, 0, 1))
    assert held is not None and held[1].tobytes() == bytes([2]) * 100
    store.put(small, data(10))
    assert store.stats().used_bytes == budget


def test_replacing_a_key_adjusts_usage_without_double_counting() -> None:
    """Re-putting a key replaces it: usage follows the new size, and a full store can still replace."""
    first = meta(size=100)
    store = ShardStore(node_id="n1", budget_bytes=cost(first))
    store.put(first, data(100, 1))
    store.put(first, data(100, 2))  # the budget only fits one copy: the old one's bytes are freed
    stats = store.stats()
    assert (stats.shards, stats.used_bytes) == (1, cost(first))
    got = store.get(ShardAddress("job", 1, 0, 0))
    assert got is not None and got[1].tobytes() == bytes([2]) * 100
    smaller = meta(size=40)
    store.put(smaller, data(40, 3))
    assert store.stats().used_bytes == cost(smaller)
    assert store.stats().shards == 1
    with pytest.raises(StoreFullError):
        store.put(meta(size=101), data(101))
    assert store.stats().used_bytes == cost(smaller)


def fill(store: ShardStore, job: str, steps: range, size: int = 32) -> None:
    for step in steps:
        for index in range(2):
            store.put(meta(job=job, step=step, index=index, size=size), data(size, step))


def held_steps(store: ShardStore, job: str) -> set[int]:
    return {m.step for m in store.inventory(job)}


def test_mark_committed_evicts_only_older_unkept_steps_of_that_job() -> None:
    """mark_committed frees the job's older, unkept steps; newer steps and other jobs' shards stay."""
    store = ShardStore(node_id="n1", budget_bytes=UNLIMITED)
    fill(store, "a", range(1, 8))
    fill(store, "b", range(1, 8))
    other_job = store.stats().jobs["b"]
    per_step = 2 * cost(meta(job="a", step=1, size=32))
    freed = store.mark_committed("a", 5, [3, 5])
    assert freed == 3 * per_step  # steps 1, 2, 4
    assert held_steps(store, "a") == {3, 5, 6, 7}  # 6 and 7 are in flight: never evicted
    assert held_steps(store, "b") == set(range(1, 8))
    assert store.stats().jobs["b"] == other_job
    assert store.committed_marks() == {"a": 5}
    # an older, late commit notice neither lowers the mark nor touches newer steps
    assert store.mark_committed("a", 4, [3, 4]) == 0
    assert store.committed_marks() == {"a": 5}
    assert held_steps(store, "a") == {3, 5, 6, 7}


def test_a_put_with_no_room_learns_commits_not_yet_announced_here_and_tries_once_more() -> None:
    """Room for two steps; step 1 committed at the registry but its announcement has not reached
    this store, so step 0 is not known to be superseded and step 2 finds no room. With
    ``learn_commits`` the store asks (once per put), marks what it learns (evicting step 0) and
    the put goes on; without it, or when nothing new is learned, the put fails as before."""
    per_step = cost(meta(step=0))
    asked: list[str] = []

    def build(learned: tuple[int, list[int]] | None) -> ShardStore:
        def learn(job: str) -> None:
            asked.append(job)
            if learned is not None:
                store.mark_committed(job, *learned)

        store = ShardStore(node_id="n1", budget_bytes=2 * per_step, learn_commits=learn)
        store.mark_committed("job", 0, [0])
        for step in (0, 1):
            store.put(meta(step=step), data(64))
        return store

    store = build((1, [1]))
    store.put(meta(step=2), data(64))
    assert asked == ["job"]
    assert held_steps(store, "job") == {1, 2}
    assert store.committed_marks() == {"job": 1}
    asked.clear()
    nothing_new = build(None)
    with pytest.raises(StoreFullError):
        nothing_new.put(meta(step=2), data(64))
    assert asked == ["job"]  # asked once, then the put failed
    assert held_steps(nothing_new, "job") == {0, 1}
    plain = ShardStore(node_id="n1", budget_bytes=2 * per_step)
    plain.mark_committed("job", 0, [0])
    for step in (0, 1):
        plain.put(meta(step=step), data(64))
    with pytest.raises(StoreFullError):
        plain.put(meta(step=2), data(64))


def test_mark_committed_keeps_the_committed_step_even_if_not_listed() -> None:
    """The committed step itself is never evicted by its own commit notice."""
    store = ShardStore(node_id="n1", budget_bytes=UNLIMITED)
    fill(store, "a", range(1, 4))
    store.mark_committed("a", 2, [])
    assert held_steps(store, "a") == {2, 3}


def test_drop_is_isolated_to_the_named_job_and_steps() -> None:
    """drop(job, steps) removes only those steps; drop(job) removes the job and its mark, nothing else."""
    store = ShardStore(node_id="n1", budget_bytes=UNLIMITED)
    fill(store, "a", range(1, 4))
    fill(store, "b", range(1, 4))
    store.mark_committed("a", 1, [1])
    store.mark_committed("b", 1, [1])
    b_before = store.inventory("b")
    assert store.drop("a", [2]) == 2 * cost(meta(job="a", step=2, size=32))
    assert held_steps(store, "a") == {1, 3}
    assert store.drop("a") > 0
    assert store.inventory("a") == []
    assert store.committed_marks() == {"b": 1}
    assert store.inventory("b") == b_before
    assert store.drop("missing") == 0
    assert store.stats().jobs == {"b": 3 * 2 * cost(meta(job="b", size=32))}


def test_concurrent_puts_never_exceed_the_budget() -> None:
    """Threads racing puts worth 3x the budget: used <= budget throughout; each rejected put raised once."""
    size = 256 * 1024
    one = cost(meta(step=1, size=size))
    budget = 10 * one + one // 2
    store = ShardStore(node_id="n1", budget_bytes=budget)
    puts = 30
    start = threading.Barrier(puts + 1)
    errors: list[StoreFullError] = []
    lock = threading.Lock()
    done = threading.Event()
    peak = [0]

    def writer(step: int) -> None:
        start.wait()
        try:
            store.put(meta(step=step, size=size), data(size, step))
        except StoreFullError as error:
            with lock:
                errors.append(error)

    def sampler() -> None:
        start.wait()
        while not done.is_set():
            peak[0] = max(peak[0], store.stats().used_bytes)

    threads = [threading.Thread(target=writer, args=(step,)) for step in range(puts)]
    watcher = threading.Thread(target=sampler)
    for thread in [*threads, watcher]:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    stats = store.stats()
    stored = [step for step in range(puts) if store.get(ShardAddress("job", step, 0, 0)) is not None]
    assert stats.used_bytes <= budget
    assert peak[0] <= budget
    assert len(stored) == budget // one == 10  # reservations make the outcome exact
    assert len(errors) == puts - len(stored)
    assert stats.shards == len(stored)
    for step in stored:
        got = store.get(ShardAddress("job", step, 0, 0))
        assert got is not None and bool((got[1] == step).all())


def test_concurrent_puts_of_mixed_sizes_account_every_rejection() -> None:
    """Racing puts of varied sizes: final used <= budget and StoreFullError count equals absent shards."""
    sizes = [1000 + 997 * i for i in range(40)]
    budget = sum(sizes) // 3
    store = ShardStore(node_id="n1", budget_bytes=budget)
    start = threading.Barrier(len(sizes))
    rejected: list[int] = []
    lock = threading.Lock()

    def writer(step: int) -> None:
        start.wait()
        try:
            store.put(meta(step=step, size=sizes[step]), data(sizes[step]))
        except StoreFullError:
            with lock:
                rejected.append(step)

    threads = [threading.Thread(target=writer, args=(step,)) for step in range(len(sizes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    absent = [step for step in range(len(sizes)) if store.get(ShardAddress("job", step, 0, 0)) is None]
    assert sorted(rejected) == absent
    assert rejected  # the total was three times the budget
    assert store.stats().used_bytes <= budget
    assert store.stats().shards == len(sizes) - len(rejected)


def test_stats_fields_add_up() -> None:
    """stats: used = data + metadata bytes, shard count, per-job usage summing to used, node and budget."""
    store = ShardStore(node_id="n7", budget_bytes=UNLIMITED)
    empty = store.stats()
    assert empty.as_dict() == {
        "node_id": "n7",
        "budget_bytes": UNLIMITED,
        "used_bytes": 0,
        "data_bytes": 0,
        "metadata_bytes": 0,
        "shards": 0,
        "jobs": {},
    }
    shards = [meta(job="a", size=10), meta(job="a", index=1, size=20), meta(job="b", size=30)]
    for m in shards:
        store.put(m, data(m.shard_size))
    stats = store.stats()
    assert stats.data_bytes == 60
    assert stats.metadata_bytes > 0
    assert stats.used_bytes == stats.data_bytes + stats.metadata_bytes
    assert stats.used_bytes == sum(cost(m) for m in shards)
    assert stats.shards == 3
    assert stats.jobs == {"a": cost(shards[0]) + cost(shards[1]), "b": cost(shards[2])}
    assert sorted(m.key for m in store.inventory()) == sorted(m.key for m in shards)
    assert [m.key for m in store.inventory("b")] == [shards[2].key]


def test_a_put_needing_new_memory_past_the_node_ceiling_is_refused_and_changes_nothing() -> None:
    """The node at 89% of its memory, ceiling 90%: a shard that would pass it is refused with
    StoreFullError naming the node's memory; what the store held is untouched."""
    in_use = {"bytes": 0}
    total = 10_000
    store = ShardStore(
        node_id="n1", budget_bytes=1 << 20, memory_ceiling=0.9, node_memory=lambda: (in_use["bytes"], total)
    )
    first = meta(step=1, size=64)
    store.put(first, data(64, fill=1))
    in_use["bytes"] = 8_900
    with pytest.raises(StoreFullError, match=r"node's memory in use \(8900 of 10000 bytes, 89%\).*90%"):
        store.put(meta(step=2, size=200), data(200))
    assert store.stats().shards == 1
    found = store.get(ShardAddress("job", 1, 0, 0))
    assert found is not None and (found[1] == 1).all()
    in_use["bytes"] = 8_000
    store.put(meta(step=2, size=200), data(200))  # room again: accepted
    assert store.stats().shards == 2


def test_reusing_an_evicted_array_needs_no_new_memory_so_saves_go_on_at_the_ceiling() -> None:
    """Steady state under memory pressure: the next step's shard reuses the evicted step's array."""
    full = {"on": False}
    store = ShardStore(
        node_id="n1",
        budget_bytes=1 << 20,
        memory_ceiling=0.9,
        node_memory=lambda: (10_000 if full["on"] else 0, 10_000),
    )
    store.put(meta(step=1, size=128), data(128, fill=1))
    store.put(meta(step=2, size=128), data(128, fill=2))
    store.mark_committed("job", 2, keep_steps=[2])  # step 1 evicted: its array becomes a spare
    full["on"] = True
    store.put(meta(step=3, size=128), data(128, fill=3))
    with pytest.raises(StoreFullError, match="ceiling"):
        store.put(meta(step=3, index=1, size=128), data(128))  # no spare left: refused
    found = store.get(ShardAddress("job", 3, 0, 0))
    assert found is not None and (found[1] == 3).all()


def test_get_ranges_returns_the_pieces_and_whether_the_whole_shard_still_matches_its_checksum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ranged reads say whether the whole shard still matches its checksum, hashing it at most
    once per INTACT_TTL_S (a restore's many ranged reads of one shard hash it once)."""
    store = ShardStore(node_id="n1", budget_bytes=UNLIMITED)
    shard = np.arange(64, dtype=np.uint8)
    good = dataclasses.replace(meta(), checksum=checksum(shard))
    store.put(good, shard)
    found = store.get_ranges(ShardAddress("job", 1, 0, 0), [(2, 5), (60, 64), (9, 9)])
    assert found is not None
    held, intact, pieces = found
    assert held == good and intact
    assert [p.tolist() for p in pieces] == [[2, 3, 4], [60, 61, 62, 63], []]
    store.get(ShardAddress("job", 1, 0, 0))[1][40] ^= 1  # type: ignore[index]  # the bytes rot in memory
    assert store.get_ranges(ShardAddress("job", 1, 0, 0), [(0, 1)])[1] is True  # type: ignore[index]  # verdict reused
    monkeypatch.setattr(store_module, "INTACT_TTL_S", 0.0)
    assert store.get_ranges(ShardAddress("job", 1, 0, 0), [(0, 1)])[1] is False  # type: ignore[index]
    assert store.get_ranges(ShardAddress("job", 1, 0, 1), [(0, 1)]) is None
    with pytest.raises(ValueError, match="outside"):
        store.get_ranges(ShardAddress("job", 1, 0, 0), [(60, 65)])


def test_a_job_past_its_share_of_the_store_is_refused_and_other_jobs_go_on() -> None:
    """A per-job budget (half the store): the greedy job's put that would pass it raises
    StoreFullError naming the job, its use, its budget and the knob; another job still fits."""
    shard = meta(job="greedy", size=100)
    budget = 4 * cost(shard)
    store = ShardStore(node_id="n1", budget_bytes=budget, job_fraction=0.5)
    store.put(dataclasses.replace(shard, step=1), data(100))
    store.put(dataclasses.replace(shard, step=2), data(100))
    before = store.stats()
    with pytest.raises(StoreFullError) as caught:
        store.put(dataclasses.replace(shard, step=3), data(100))
    error = caught.value
    assert "'greedy'" in str(error) and "RAY_CKPT_STORE_JOB_FRACTION" in str(error)
    assert f"holds {2 * cost(shard)} bytes here" in str(error)
    assert (error.job, error.used_bytes, error.budget_bytes) == ("greedy", 2 * cost(shard), budget // 2)
    assert store.stats() == before
    store.put(dataclasses.replace(shard, step=2), data(100, fill=9))  # a retried save replaces: fits
    for step in (1, 2):
        store.put(dataclasses.replace(shard, job="modest", step=step), data(100))
    assert store.stats().jobs == {"greedy": 2 * cost(shard), "modest": 2 * cost(shard)}


def test_a_job_that_filled_the_store_leaves_room_for_another_and_keeps_its_newest_committed_step() -> None:
    """The default fair share: job A fills the store (two committed steps, one in flight); job B
    saves and commits anyway, by evicting A's superseded step only; A's newest committed step
    and its save in flight survive intact. A's next save past its half then gives up A's own
    superseded step, and a put still past it is refused naming A, its share and the knob."""
    per_step = 2 * cost(meta(job="a", size=32))  # two shards a step
    store = ShardStore(node_id="n1", budget_bytes=3 * per_step)
    fill(store, "a", range(1, 3))
    store.mark_committed("a", 2, [1, 2])  # keep_committed=2
    fill(store, "a", range(3, 4))  # a save in flight
    assert store.stats().used_bytes == store.budget_bytes  # A alone filled it, as before
    fill(store, "b", range(1, 2))
    store.mark_committed("b", 1, [1])
    assert (held_steps(store, "a"), held_steps(store, "b")) == ({2, 3}, {1})
    for step in (2, 3):
        found = store.get(ShardAddress("a", step, 0, 1))
        assert found is not None and bool((found[1] == step).all())
    store.mark_committed("a", 3, [2, 3])
    store.put(meta(job="a", step=4, index=0, size=32), data(32, 4))  # past A's half: step 2 goes
    assert (held_steps(store, "a"), held_steps(store, "b")) == ({3, 4}, {1})
    before = store.stats()
    with pytest.raises(StoreFullError) as caught:
        store.put(meta(job="a", step=4, index=1, size=32), data(32, 4))
    error = caught.value
    share = store.budget_bytes // 2
    assert (error.job, error.used_bytes, error.budget_bytes) == ("a", per_step + per_step // 2, share)
    assert f"may hold {share}" in str(error) and "2 jobs" in str(error)
    assert "RAY_CKPT_STORE_JOB_FRACTION=fair" in str(error)
    assert store.stats() == before  # refused: nothing evicted
    store.job_fraction = 1.0  # the old rule, no per-job limit: the store has room, so A's put fits
    store.put(meta(job="a", step=4, index=1, size=32), data(32, 4))
    store.job_fraction = None
    assert store.job_fraction is None


def test_puts_racing_for_a_shared_store_never_pass_the_budget_or_evict_a_newest_committed_step() -> None:
    """Two jobs, each at its half with a committed step and three superseded ones, racing puts
    worth twice the budget from many threads: used never passes the budget, each job takes
    exactly the six shards its superseded steps made room for, and each job's newest committed
    step is still whole at the end (then, both dropped, the whole budget is free again)."""
    size = 4096
    shard = cost(meta(job="a", size=size))
    store = ShardStore(node_id="n1", budget_bytes=16 * shard)
    for job in ("a", "b"):
        fill(store, job, range(1, 5), size=size)
        store.mark_committed(job, 4, [1, 2, 3, 4])
    start = threading.Barrier(16)
    lock = threading.Lock()
    taken = {"a": 0, "b": 0}
    peak = [0]

    def save(job: str, step: int) -> None:
        start.wait()
        for index in range(2):
            try:
                store.put(meta(job=job, step=step, index=index, size=size), data(size, step))
                with lock:
                    taken[job] += 1
            except StoreFullError:
                pass
            used = store.stats().used_bytes
            with lock:
                peak[0] = max(peak[0], used)

    threads = [threading.Thread(target=save, args=(job, step)) for job in ("a", "b") for step in range(5, 13)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] <= store.budget_bytes and taken == {"a": 6, "b": 6}
    assert store.stats().jobs == {"a": 8 * shard, "b": 8 * shard}
    for job in ("a", "b"):
        for index in range(2):
            found = store.get(ShardAddress(job, 4, 0, index))
            assert found is not None and bool((found[1] == 4).all())
    for job in ("a", "b"):  # the store's count of held bytes followed every put, replacement and eviction
        store.drop(job)
    whole = meta(job="c", size=16 * size)
    store.budget_bytes = cost(whole)
    store.put(whole, data(16 * size))


def test_puts_in_flight_count_against_their_jobs_budget() -> None:
    """Concurrent puts of one job never take it past its share, whatever their interleaving."""
    shard = meta(job="j", size=1000)
    store = ShardStore(node_id="n1", budget_bytes=10 * cost(shard), job_fraction=0.3)
    refused: list[StoreFullError] = []

    def put(step: int) -> None:
        try:
            store.put(dataclasses.replace(shard, step=step), data(1000))
        except StoreFullError as error:
            refused.append(error)

    threads = [threading.Thread(target=put, args=(step,)) for step in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.stats().jobs == {"j": 3 * cost(shard)} and len(refused) == 5


@pytest.mark.parametrize("fraction", [float("nan"), float("inf"), -0.5, 0.0, 1.5, True, "0.5"])
def test_a_memory_ceiling_or_job_fraction_outside_0_to_1_is_refused(fraction: object) -> None:
    """NaN would turn the node-memory guard off (every comparison with it is False): refused,
    at creation and on a running store, with the knob named; the store keeps its value."""
    with pytest.raises(ConfigError, match="memory_ceiling"):
        ShardStore(node_id="n1", budget_bytes=1 << 20, memory_ceiling=fraction)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="job_fraction"):
        ShardStore(node_id="n1", budget_bytes=1 << 20, job_fraction=fraction)  # type: ignore[arg-type]
    store = ShardStore(node_id="n1", budget_bytes=1 << 20, memory_ceiling=0.9)
    with pytest.raises(ConfigError, match="RAY_CKPT_NODE_MEMORY_CEILING"):
        store.memory_ceiling = fraction  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="RAY_CKPT_STORE_JOB_FRACTION"):
        store.job_fraction = fraction  # type: ignore[assignment]
    assert (store.memory_ceiling, store.job_fraction) == (0.9, None)  # None: the fair share
    store.memory_ceiling = 1
    assert store.memory_ceiling == 1.0


def test_the_job_fraction_knob_defaults_to_the_fair_share_and_refuses_nan() -> None:
    """RAY_CKPT_STORE_JOB_FRACTION: unset or "fair" is the fair share (None), a number in (0, 1]
    a fixed share; NaN, 0 and values past 1 are refused naming the knob."""
    assert settings.store_job_fraction() is None
    assert ShardStore(node_id="n1", budget_bytes=1 << 20).job_fraction is None
    for fair in ("fair", "FAIR", " fair "):
        with settings.override(RAY_CKPT_STORE_JOB_FRACTION=fair):
            assert settings.store_job_fraction() is None
    with settings.override(RAY_CKPT_STORE_JOB_FRACTION="0.25"):
        assert settings.store_job_fraction() == 0.25
    for bad in ("nan", "0", "1.5", "-1"):
        with settings.override(RAY_CKPT_STORE_JOB_FRACTION=bad), pytest.raises(ValueError, match=r"in \(0, 1\]"):
            settings.store_job_fraction()
    with settings.override(RAY_CKPT_STORE_JOB_FRACTION="half"), pytest.raises(ValueError, match="JOB_FRACTION"):
        settings.store_job_fraction()


def test_a_local_copy_is_kept_apart_from_shard_0_by_its_address_alone() -> None:
    """A rank's local copy (index 0 of a k=1, m=0 code) and its coded shard 0 live side by side,
    each read back at its own address; the inventory lists the coded shard only, a local copy
    with another index is refused and changes nothing, and dropping the step evicts both."""
    store = ShardStore(node_id="n1", budget_bytes=UNLIMITED)
    coded = meta(index=0, size=64)
    whole = dataclasses.replace(coded, data_shards=1, parity_shards=0, payload_size=128, shard_size=128)
    store.put(coded, data(64, fill=1))
    store.put(whole, data(128, fill=2), local=True)
    shard_0, copy = store.get(ShardAddress.of(coded)), store.get(ShardAddress.local_copy("job", 1, 0))
    assert shard_0 is not None and shard_0[0] == coded and shard_0[1].tobytes() == bytes([1]) * 64
    assert copy is not None and copy[0] == whole and copy[1].tobytes() == bytes([2]) * 128
    assert ShardAddress.of(whole, local=True) == ShardAddress.local_copy("job", 1, 0)
    ranged = store.get_ranges(ShardAddress.local_copy("job", 1, 0), [(100, 104)])
    assert ranged is not None and ranged[2][0].tobytes() == bytes([2]) * 4
    assert store.inventory() == [coded]
    before = store.stats()
    with pytest.raises(ConfigError, match="index 0"):
        store.put(dataclasses.replace(whole, index=1, data_shards=2, shard_size=64), data(64), local=True)
    assert store.stats() == before
    assert store.drop("job", [1]) == cost(coded) + cost(whole)
    assert store.get(ShardAddress.of(coded)) is None and store.get(ShardAddress.local_copy("job", 1, 0)) is None
