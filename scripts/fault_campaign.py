"""Randomized fault campaign: random interleavings of saves, faults and restores, with an oracle.

On a simulated cluster, each trial runs one job of ``--ranks`` ranks (RS(2,1) or RS(2,2), with
or without local copies, with persistent backups every 3 steps) through a random sequence of:
full saves, torn saves (some ranks never stage), hard kills of up to m nodes, hard kills of
more than m nodes, store-actor kills, registry kills, shard corruption (bit flips written into a
store), the cluster shrinking below k+m stores (saves must go on with the protection their real
placement gives; rejoining nodes must get stores by themselves and bring full protection back),
restores by a fresh incarnation of every rank, a torn step re-saved by the next group (without
restoring, when it names an attempt: it must commit and restore), and a group replaced while
its save of a step runs (the abandoned save goes on while the next group restores, or saves
that step itself). A third of the trials pass no ``attempt`` (every rank of a group restores
before it saves). Killed nodes are replaced.

The invariants of docs/commit-protocol.md, checked at cluster level: after every restore, every
rank restored the same step, that step was committed (or is a complete backup, all ranks alike)
and every rank's state is bit-exact the state its group saved at that step (never a mix, never
a torn step); after every commit, the registry's records of the step are all of the group that
staged it, and no step is committed by two groups while the first commit stands; or the call
raised a specific ray_ckpt error. Anything else is a violation: a partial or mixed state,
another exception, or a call that outlived its timeout.

    python scripts/fault_campaign.py --trials 20 --seed 1 [--ops 10] [--always shrink] [--json PATH]
    python scripts/fault_campaign.py --in-place --trials 20 --seed 1   # see InPlaceCampaign
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import random
import sys
import tempfile
import time
import uuid
from typing import Any

PEER_TIMEOUT_S = 15.0
STORE_BUDGET_BYTES = 256 << 20
OPERATIONS = [
    "save",
    "torn",
    "kill_le_m",
    "kill_gt_m",
    "kill_store",
    "kill_registry",
    "corrupt",
    "shrink",
    "restore",
    "resave_torn",
    "zombie",
]
WEIGHTS = [6, 1, 2, 1, 1, 1, 1, 1, 3, 1, 2]
SLACK_S = 30.0


def make_state(trial: int, rank: int, step: int, generation: int) -> dict[str, Any]:
    """The state a rank saves at ``step`` in incarnation ``generation`` (so that a stale or
    mixed restore of a re-saved step number is caught)."""
    import torch

    generator = torch.Generator().manual_seed(((trial * 1_000_003 + rank) * 1009 + step) * 7919 + generation)
    return {
        "model": {"w": torch.randn(20_000, generator=generator), "steps": torch.tensor(step)},
        "optim": {"state": {0: {"exp_avg": torch.randn(3000, generator=generator)}}, "lr": 0.01},
        "step": step,
    }


def close_quietly(checkpointer: Any) -> None:
    """Close a rank's checkpointer whose incarnation ends; its pending error no longer matters."""
    with contextlib.suppress(Exception):
        checkpointer.close()


class Trial:
    """One job under faults, with an oracle of what was committed. A third of the trials pass
    no ``attempt`` (the plain-Ray contract: every rank of a new group restores before it saves);
    the others name one attempt per group, and a new group may save before it restores."""

    def __init__(self, campaign: Campaign, index: int, rng: random.Random) -> None:
        import ray_ckpt

        self.campaign, self.index, self.rng = campaign, index, rng
        self.job = f"trial-{index}-{uuid.uuid4().hex[:6]}"
        parity = rng.choice([1, 2])
        self.m = parity
        self.config = ray_ckpt.CheckpointConfig(
            data_shards=2,
            parity_shards=parity,
            local_copy=rng.random() < 0.3,
            backup_every=3,
            backup_uri=campaign.backup_root,
            keep_committed=2,
            commit_timeout_s=PEER_TIMEOUT_S,
        )
        self.ranks = campaign.ranks
        self.plain = rng.random() < 1 / 3  # no attempt: each group restores on every rank first
        self.next_step = 0
        self.generation = -1
        self.committed: dict[int, int] = {}  # the oracle: step every rank saved -> its generation
        self.writers: dict[int, set[str]] = {}  # generation -> its ranks' writer ids
        self.ops: list[str] = []  # what happened so far, printed with a violation
        self.zombies: list[Any] = []  # checkpointers of earlier groups whose save is still running
        self.checkpointers = self._incarnation()

    def _incarnation(self, keep_old: bool = False) -> list[Any]:
        """A new incarnation of every rank (what Ray Train does after any failure); with
        ``keep_old`` the old group's checkpointers stay open (their save goes on: zombies)."""
        import ray_ckpt

        for checkpointer in getattr(self, "checkpointers", []):
            if keep_old:
                self.zombies.append(checkpointer)
            else:
                close_quietly(checkpointer)
        self.generation += 1
        self.must_restore = self.plain
        attempt = None if self.plain else uuid.uuid4().hex
        group = [
            ray_ckpt.Checkpointer(job=self.job, rank=r, world_size=self.ranks, config=self.config, attempt=attempt)
            for r in range(self.ranks)
        ]
        self.writers[self.generation] = {c.writer for c in group}
        return group

    def bury_zombies(self) -> None:
        for checkpointer in self.zombies:
            close_quietly(checkpointer)
        self.zombies.clear()

    # ---- operations ---------------------------------------------------------------------

    def save(self, torn: bool = False, must_succeed: bool = False) -> None:
        """Save the next step on every rank (``torn``: on some). ``must_succeed``: any error is
        a violation (a save on a cluster below k+m stores must go on)."""
        import ray_ckpt

        if not self._ready():
            return
        step = self.next_step
        writers = range(self.ranks) if not torn else range(self.rng.randrange(self.ranks))
        handles = []
        try:
            for r in writers:
                handles.append(self.checkpointers[r].save(step, make_state(self.index, r, step, self.generation)))
            for handle in handles:
                handle.staged(timeout_s=PEER_TIMEOUT_S + SLACK_S)
        except ray_ckpt.RayCkptError as error:  # e.g. a store died mid-save: a clean error
            if must_succeed:
                self.campaign.violation(self, f"save of step {step} failed: {type(error).__name__}: {error}")
            self.campaign.count_error("save", error)
            self.checkpointers = self._incarnation()  # the failed ranks restart, as Ray Train would
            return
        self.next_step += 1
        if not torn:
            self._committed(step, self.generation)
        else:  # the ranks that did not stage "crashed": the job restarts
            self.checkpointers = self._incarnation()

    def _ready(self) -> bool:
        """Whether the group may train: a group without an attempt restores first (up to three
        tries, each failure starting a new group)."""
        for _ in range(3):
            if self.must_restore:
                self.restore(new_group=False)
        return not self.must_restore

    def _committed(self, step: int, generation: int) -> None:
        """Every rank of ``generation`` staged ``step``: the oracle takes it as committed, and
        the registry's commit must hold that group's records only (never another group's)."""
        import ray

        from ray_ckpt.transport import naming

        if step in self.committed and self.committed[step] != generation:
            self.campaign.violation(
                self, f"step {step} committed by group {generation} while group {self.committed[step]}'s commit stood"
            )
        self.committed[step] = generation
        registry = naming.registry_handle(self.campaign.namespace)
        try:
            located = ray.get(registry.locate.remote(self.job, step), timeout=PEER_TIMEOUT_S)
        except Exception as error:  # a registry killed meanwhile answers after its rebuild
            self.campaign.count_error("locate", error)
            return
        writers = {m["writer"] for record in located.values() for m in record["metas"].values()}
        if not writers <= self.writers[generation]:
            self.campaign.violation(self, f"step {step}'s commit holds records of another group: {sorted(writers)}")

    def resave_torn(self) -> None:
        """Some ranks stage step s and the group dies; the next group saves step s again
        (without restoring, when it has an attempt): its save commits, bit-exact its own."""
        torn = self.next_step
        self.save(torn=True)
        if self.must_restore:
            self.restore(new_group=False)
        if not self.plain and self.next_step == torn + 1:
            self.next_step = torn  # the torn step's number
        step = self.next_step
        self.save()
        if self.committed.get(step) != self.generation:
            return
        self.restore()  # nothing failed since the commit: the step must come back
        if self.last_restored != step:
            self.campaign.violation(
                self, f"step {step}, re-saved after a torn save, did not restore ({self.last_restored})"
            )

    def zombie(self) -> None:
        """Every rank of the group starts a save of step s and the group is replaced while the
        save runs (an abandoned save goes on); the new group restores first, or (with an
        attempt) saves step s itself without restoring. A step both groups' ranks all staged
        is a violation; the oracle takes the one that did."""
        import ray_ckpt

        if not self._ready():
            return
        step, old = self.next_step, self.generation
        started: list[Any] = []
        try:
            for r, checkpointer in enumerate(self.checkpointers):
                started.append(checkpointer.save(step, make_state(self.index, r, step, old)))
        except ray_ckpt.RayCkptError as error:
            self.campaign.count_error("save", error)
        self.checkpointers = self._incarnation(keep_old=True)
        if self.plain or self.rng.random() < 0.5:
            self.restore(new_group=False, settle=(started, step, old))
        else:
            self.save()
            self._settle(started, step, old)
        self.bury_zombies()
        self.campaign.faults["zombie"] += 1

    def _settle(self, handles: list[Any], step: int, generation: int) -> None:
        """Wait for an abandoned save: when every rank of its group staged it, it committed
        (before the new group fenced it off)."""
        import ray_ckpt

        if len(handles) < self.ranks:
            return
        try:
            for handle in handles:
                handle.staged(timeout_s=PEER_TIMEOUT_S + SLACK_S)
        except ray_ckpt.RayCkptError as error:  # refused: the new group came first
            self.campaign.count_error("zombie", error)
            return
        except TimeoutError:
            self.campaign.violation(self, f"an abandoned save of step {step} neither staged nor failed")
            return
        self._committed(step, generation)
        self.next_step = max(self.next_step, step + 1)

    def restore(self, new_group: bool = True, settle: tuple[list[Any], int, int] | None = None) -> None:
        """Every rank of a new group (``new_group``: else of the current one) restores; with
        ``settle``, an abandoned save's outcome is taken into the oracle before the check."""
        import ray_ckpt

        if new_group:
            self.checkpointers = self._incarnation()
        self.must_restore = False
        self.last_restored = None
        results: list[Any] = []
        started = time.monotonic()
        try:
            for checkpointer in self.checkpointers:
                results.append(checkpointer.restore())
        except ray_ckpt.RayCkptError as error:
            self.campaign.count_error("restore", error)
            self.checkpointers = self._incarnation()
            self.campaign.restores += 1
            return
        except Exception as error:  # anything else breaks the promise
            self.campaign.violation(self, f"restore raised {type(error).__name__}: {error}")
            return
        finally:
            elapsed = time.monotonic() - started
            if elapsed > self.ranks * (PEER_TIMEOUT_S + SLACK_S):
                self.campaign.violation(self, f"restore took {elapsed:.1f} s, past its timeouts")
            if settle is not None:
                self._settle(*settle)
        self.campaign.restores += 1
        self._check(results)

    def _check(self, results: list[Any]) -> None:
        from ray_ckpt.testing import digest

        if all(r is None for r in results):
            if self.committed:
                self.campaign.violation(self, f"restore returned None although steps {self.committed} committed")
            return
        if any(r is None for r in results):
            self.campaign.violation(self, "some ranks restored nothing while others restored a step")
            return
        steps = {r.step for r in results}
        sources = {r.source for r in results}
        if len(steps) != 1:
            self.campaign.violation(self, f"ranks restored different steps {sorted(steps)}")
            return
        step = steps.pop()
        if step not in self.committed:
            self.campaign.violation(
                self, f"restored step {step}, never committed (committed: {sorted(self.committed)})"
            )
            return
        if "backup" in sources and (len(sources) != 1 or step % self.config.backup_every):
            self.campaign.violation(self, f"mixed or impossible backup restore: step {step}, sources {sources}")
            return
        for rank, restored in enumerate(results):
            if digest(restored.state) != digest(make_state(self.index, rank, step, self.committed[step])):
                self.campaign.violation(self, f"rank {rank} state of step {step} is not bit-exact")
                return
        if step != max(self.committed):
            self.campaign.fallbacks += 1
        # training resumes after the restored step; newer commits are gone
        self.committed = {s: g for s, g in self.committed.items() if s <= step}
        self.next_step = step + 1
        self.last_restored = step

    def shrink_and_regrow(self) -> None:
        """Kill worker nodes one at a time (at most m at once) until fewer than k+m stores are
        alive; saves must go on, each with the protection its real placement gives, and the
        restore must hold the invariant. Then add nodes without calling ``ray_ckpt.start()``:
        their stores must start by themselves and the next save must be fully protected."""
        total = self.config.data_shards + self.config.parity_shards
        workers = self.campaign.store_count() - 1  # the head's store stays
        target = self.rng.randint(0, min(workers, total - 2))  # worker stores left: target + 1 < k + m
        while workers > target:
            count = min(self.m, workers - target)
            self.campaign.kill_nodes(count, replenish=False)
            workers -= count
            if workers > target:
                self.save(must_succeed=True)  # each step is spread over the stores still alive
        self.save(must_succeed=True)
        protections = [c.last_protection for c in self.checkpointers]
        if None in protections:  # the save failed: already a violation
            return
        low = min(protections)
        if low >= self.m:
            self.campaign.violation(self, f"{target + 1} stores for {total} shards, yet protection {low}")
        self.restore()
        self.campaign.regrow()
        self.save(must_succeed=True)
        if any(c.last_protection != self.m for c in self.checkpointers):
            protections = [c.last_protection for c in self.checkpointers]
            self.campaign.violation(self, f"full spreading did not return after nodes rejoined: {protections}")
        self.campaign.faults["shrink"] += 1

    def corrupt(self) -> None:
        import numpy as np
        import ray

        from ray_ckpt.core.shard import ShardAddress
        from ray_ckpt.transport import naming

        if not self.committed:
            return
        registry = naming.registry_handle(self.campaign.namespace)
        latest = ray.get(registry.latest_committed.remote(self.job))
        if latest is None:
            return
        located = ray.get(registry.locate.remote(self.job, latest))
        rank = self.rng.randrange(self.ranks)
        index = self.rng.choice(sorted(located[rank]["nodes"]))
        store = naming.store_handles(self.campaign.namespace).get(located[rank]["nodes"][index])
        if store is None:
            return
        writer = located[rank]["metas"][index]["writer"]
        address = ShardAddress(self.job, latest, rank, int(index), writer=writer)
        found = ray.get(store.get.remote(address.to_wire()), timeout=PEER_TIMEOUT_S)
        if found is None:
            return
        meta, data = found
        forged = np.array(data, copy=True)
        forged[self.rng.randrange(forged.size)] ^= 1 << self.rng.randrange(8)
        ray.get(store.put.remote(meta, forged), timeout=PEER_TIMEOUT_S)
        self.campaign.faults["corrupt"] += 1


class Campaign:
    def __init__(self, *, nodes: int, ranks: int, seed: int) -> None:
        self.nodes, self.ranks, self.seed = nodes, ranks, seed
        self.backup_root = tempfile.mkdtemp(prefix="rckcampaign")
        self.namespace = f"campaign-{uuid.uuid4().hex[:6]}"
        self.restores = 0
        self.fallbacks = 0
        self.violations: list[str] = []
        self.errors_by_kind: dict[str, int] = {}
        self.faults = dict.fromkeys(
            ["kill_le_m", "kill_gt_m", "kill_store", "kill_registry", "corrupt", "shrink", "resave_torn", "zombie"], 0
        )

    def count_error(self, where: str, error: BaseException) -> None:
        key = f"{where}:{type(error).__name__}"
        self.errors_by_kind[key] = self.errors_by_kind.get(key, 0) + 1

    def violation(self, trial: Trial, what: str) -> None:
        self.violations.append(f"trial {trial.index} ({trial.job}, {'plain' if trial.plain else 'attempts'}): {what}")
        print("VIOLATION", self.violations[-1], "after", " ".join(trial.ops), flush=True)

    # ---- cluster faults -----------------------------------------------------------------

    def kill_nodes(self, count: int, replenish: bool = True) -> None:
        victims = self.rng.sample(list(self.cluster.worker_nodes), count)
        # a node Ray never declares dead is not itself a violation: the trial goes on
        with contextlib.suppress(TimeoutError):
            self.sim.kill([str(v.node_id) for v in victims])
        if replenish:
            self.replenish()

    def store_count(self) -> int:
        """Alive nodes that run a store."""
        from ray_ckpt.transport import naming

        return len(naming.store_node_ids(self.namespace) & naming.alive_node_ids())

    def regrow(self) -> None:
        """Add worker nodes back up to ``--nodes`` without ``ray_ckpt.start()``; a violation
        unless their stores start by themselves within 30 s."""
        self.sim.add_workers(self.nodes - len(self.cluster.worker_nodes))
        deadline = time.monotonic() + 30
        while self.store_count() < self.nodes + 1:
            if time.monotonic() > deadline:
                self.violations.append(f"rejoined nodes got no store: {self.store_count()} of {self.nodes + 1}")
                return
            time.sleep(0.2)

    def replenish(self) -> None:
        self.sim.add_workers(self.nodes - len(self.cluster.worker_nodes))
        self.sim.start_service(STORE_BUDGET_BYTES)

    def kill_store(self) -> None:
        import ray

        from ray_ckpt.transport import naming

        stores = naming.store_handles(self.namespace)
        workers = [n.node_id for n in self.cluster.worker_nodes]
        node_id = self.rng.choice([n for n in workers if n in stores])
        ray.kill(stores[node_id], no_restart=True)
        time.sleep(0.5)
        self.faults["kill_store"] += 1

    def kill_registry(self) -> None:
        import ray

        from ray_ckpt.transport import naming

        ray.kill(naming.registry_handle(self.namespace), no_restart=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                ray.get(naming.registry_handle(self.namespace).ready.remote(), timeout=5)
                break
            except Exception:
                time.sleep(0.2)
        self.faults["kill_registry"] += 1

    # ---- the campaign -------------------------------------------------------------------

    def run(self, trials: int, ops: int, always: tuple[str, ...] = ()) -> dict[str, Any]:
        from ray_ckpt.testing import SimulatedCluster
        from ray_ckpt.tools import quiet

        self.rng = random.Random(self.seed)
        os.environ["RAY_CKPT_PEER_TIMEOUT_S"] = str(PEER_TIMEOUT_S)
        self.sim = SimulatedCluster(
            self.nodes, store_budget_bytes=STORE_BUDGET_BYTES, namespace=self.namespace, logging_level="ERROR"
        )
        quiet.quiet_driver()  # Ray's messages about the nodes killed below stay in its logs
        self.cluster = self.sim.cluster
        try:
            os.environ["RAY_CKPT_NAMESPACE"] = self.namespace
            for index in range(trials):
                trial = Trial(self, index, random.Random(self.rng.random()))
                trial.save()
                for choice in always:
                    self.step(trial, choice)
                for _ in range(ops):
                    self.step(trial)
                trial.restore()
                trial.bury_zombies()
                for checkpointer in trial.checkpointers:
                    close_quietly(checkpointer)
                print(
                    f"trial {index}: restores {self.restores}, fallbacks {self.fallbacks}, "
                    f"violations {len(self.violations)}",
                    flush=True,
                )
        finally:
            self.sim.shutdown()
        return {
            "trials": trials,
            "restores": self.restores,
            "violations": len(self.violations),
            "violation_details": self.violations,
            "fallbacks": self.fallbacks,
            "errors_by_kind": self.errors_by_kind,
            "faults": self.faults,
        }

    def step(self, trial: Trial, choice: str | None = None) -> None:
        """One operation on ``trial``: ``choice``, or one drawn at random."""
        if choice is None:
            choice = self.rng.choices(OPERATIONS, weights=WEIGHTS)[0]
        trial.ops.append(f"{choice}@{trial.next_step}")
        if choice == "save":
            trial.save()
        elif choice == "torn":
            trial.save(torn=True)
        elif choice == "kill_le_m":
            self.kill_nodes(self.rng.randint(1, trial.m))
            self.faults["kill_le_m"] += 1
        elif choice == "kill_gt_m":
            self.kill_nodes(trial.m + 1)
            self.faults["kill_gt_m"] += 1
        elif choice == "kill_store":
            self.kill_store()
            self.replenish()
        elif choice == "kill_registry":
            self.kill_registry()
        elif choice == "corrupt":
            trial.corrupt()
        elif choice == "shrink":
            trial.shrink_and_regrow()
        elif choice == "resave_torn":
            trial.resave_torn()
            self.faults["resave_torn"] += 1
        elif choice == "zombie":
            trial.zombie()
        else:
            trial.restore()


IN_PLACE_FAULTS = ("kill", "kill_during_recovery", "two_kills", "hang")
IN_PLACE_STEPS = 18
IN_PLACE_WORKERS = 3


class InPlaceCampaign:
    """``--in-place``: TorchTrainer jobs (3 ranks, gloo, ``ray_ckpt.train.InPlaceRecovery``,
    RS(2,2)) from ``scripts/train_example.py`` under one random fault plan each: a node kill, a
    kill and a second one 0.3-3 s later while the survivors wait for the replacement, two kills
    6 steps apart, or a worker hung with SIGSTOP; each strikes a seeded 0-0.2 s after its step's
    commit was seen, i.e. anywhere in the next step (forward, allreduce, save, before the
    commit). The oracle: the job finishes, its final parameters are bit-identical to an
    uninterrupted run's, every restore after a failure came from memory (local or peers), and
    after the first failure of a plain kill the survivors kept their processes.
    ``ranks_per_node`` > 1: the simulated nodes have that many CPUs and the jobs twice as many
    ranks, packed by Ray Train, so a node kill takes several ranks at once (every rank that was
    on the node is replaced; the ranks of other nodes are the survivors)."""

    def __init__(self, *, nodes: int, seed: int, ranks_per_node: int = 1) -> None:
        self.nodes, self.seed, self.ranks_per_node = nodes, seed, ranks_per_node
        self.workers = IN_PLACE_WORKERS if ranks_per_node == 1 else 2 * ranks_per_node
        self.violations: list[str] = []
        self.faults = dict.fromkeys(IN_PLACE_FAULTS, 0)
        self.recoveries = 0

    def run(self, trials: int) -> dict[str, Any]:
        import importlib.util
        import threading

        import ray

        from ray_ckpt.testing import SimulatedCluster
        from ray_ckpt.tools import quiet

        spec = importlib.util.spec_from_file_location(
            "train_example", pathlib.Path(__file__).with_name("train_example.py")
        )
        assert spec is not None and spec.loader is not None
        example = importlib.util.module_from_spec(spec)
        sys.modules["train_example"] = example
        spec.loader.exec_module(example)
        ray.cloudpickle.register_pickle_by_value(example)  # workers cannot import scripts/
        os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
        rng = random.Random(self.seed)
        checkpoint = {"data_shards": 2, "parity_shards": 2}
        with SimulatedCluster(
            self.nodes, worker_cpus=self.ranks_per_node, store_budget_bytes=STORE_BUDGET_BYTES, logging_level="ERROR"
        ) as sim:
            quiet.quiet_driver()  # Ray's messages about the nodes killed below stay in its logs
            common: dict[str, Any] = {"steps": IN_PLACE_STEPS, "workers": self.workers, "checkpoint": checkpoint}
            reference = example.run(
                name="campaign-reference",
                storage_path=tempfile.mkdtemp(),
                events_dir=tempfile.mkdtemp(),
                step_sleep_s=0.0,
                **common,
            )["params_digest"]
            for index in range(trials):
                kind = rng.choice(IN_PLACE_FAULTS)
                first = rng.randint(2, IN_PLACE_STEPS - 10)
                delays = (rng.uniform(0.0, 0.2), rng.uniform(0.3, 3.0))
                victims = rng.sample(range(self.workers), 2)
                name, events = f"campaign-{index}", tempfile.mkdtemp()
                plan = {"kind": kind, "first": first, "delays": delays, "victims": victims, "job": name}
                plan["workers"] = self.workers  # the ranks a kill may find on its node
                killed: list[str] = []
                lost: list[list[int]] = []  # per node killed: the ranks it ran
                errors: list[BaseException] = []
                thread = threading.Thread(
                    target=self._inject, args=(plan, sim, example, events, killed, lost, errors), daemon=True
                )
                thread.start()
                what = f"trial {index} ({kind} of ranks {victims} after step {first})"
                try:
                    final = example.run(
                        name=name,
                        storage_path=tempfile.mkdtemp(),
                        events_dir=events,
                        step_sleep_s=0.15,
                        max_failures=8,
                        in_place={"timeout_s": 60, "hang_timeout_s": 3.0},
                        **common,
                    )
                except Exception as error:
                    self.violations.append(f"{what}: the job failed: {type(error).__name__}: {error}")
                    final = None
                thread.join(timeout=30)
                self.faults[kind] += 1
                if errors:
                    self.violations.append(f"{what}: the fault did not happen: {errors[0]!r}")
                if final is not None:
                    bit_exact = final["params_digest"] == reference
                    self._check(what, kind, bit_exact, example.read_restores(events), lost[0] if lost else [])
                sim.add_workers(max(1, len(killed)))
                print(f"{what}: recoveries {self.recoveries}, violations {len(self.violations)}", flush=True)
        return {
            "mode": "in_place",
            "ranks_per_node": self.ranks_per_node,
            "trials": trials,
            "recoveries": self.recoveries,
            "violations": len(self.violations),
            "violation_details": self.violations,
            "faults": self.faults,
        }

    @staticmethod
    def _inject(
        plan: dict[str, Any],
        sim: Any,
        example: Any,
        events: str,
        killed: list[str],
        lost: list[list[int]],
        errors: list[BaseException],
    ) -> None:
        """Carry out one fault plan (on its own thread); a failure to do so lands in ``errors``."""
        import signal

        job, first, delays, victims = plan["job"], plan["first"], plan["delays"], plan["victims"]

        def strike(rank: int, after_step: int, delay_s: float) -> None:
            example.wait_committed(job, after_step)
            time.sleep(delay_s)
            node = example.rank_node(job, rank)
            if node not in killed:
                lost.append([r for r in range(plan["workers"]) if example.rank_node(job, r) == node])
                killed.append(node)
                example.remove_node(sim, node)

        try:
            if plan["kind"] == "hang":
                example.wait_committed(job, first)
                time.sleep(delays[0])
                pid = next(r["pid"] for r in example.read_restores(events) if r["rank"] == victims[0])
                os.kill(pid, signal.SIGSTOP)
                return
            strike(victims[0], first, delays[0])
            if plan["kind"] == "kill_during_recovery":
                time.sleep(delays[1])
                strike(victims[1], first, 0.0)
            elif plan["kind"] == "two_kills":
                strike(victims[1], first + 6, delays[0])
        except BaseException as error:  # reported as a violation
            errors.append(error)

    def _check(self, what: str, kind: str, bit_exact: bool, restores: list[dict[str, Any]], lost: list[int]) -> None:
        attempts: dict[str, dict[int, dict[str, Any]]] = {}
        for record in restores:
            attempts.setdefault(record["attempt"], {})[record["rank"]] = record
        groups = list(attempts.values())
        self.recoveries += len(groups) - 1
        if not bit_exact:
            self.violations.append(f"{what}: the final parameters differ from the uninterrupted run's")
        if len(groups) < 2:
            self.violations.append(f"{what}: no recovery was recorded")
            return
        if any(r["source"] not in ("local", "peers") for g in groups[1:] for r in g.values()):
            self.violations.append(f"{what}: a restore did not come from memory: {groups[1:]}")
        if kind in ("kill", "two_kills"):
            before, after = groups[0], groups[1]
            kept = sorted(r for r in after if after[r]["pid"] == before.get(r, {}).get("pid"))
            survivors = sorted(set(range(self.workers)) - set(lost))
            if not lost or kept != survivors:
                self.violations.append(
                    f"{what}: ranks {kept} kept their process, expected the survivors {survivors} (lost {lost})"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", type=int, default=10, help="random operations per trial")
    parser.add_argument("--nodes", type=int, default=6, help="simulated one-CPU worker nodes")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument(
        "--always",
        action="append",
        default=[],
        choices=OPERATIONS,
        help="run this operation once in every trial, after its first save (repeatable)",
    )
    parser.add_argument(
        "--in-place", action="store_true", help="TorchTrainer jobs with InPlaceRecovery under random kills and hangs"
    )
    parser.add_argument(
        "--ranks-per-node",
        type=int,
        default=1,
        help="with --in-place: CPUs per simulated node; > 1 runs twice as many ranks, packed: a kill takes several",
    )
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rckcampaign"))
    started = time.time()
    if args.in_place:
        report = InPlaceCampaign(nodes=max(args.nodes, 7), seed=args.seed, ranks_per_node=args.ranks_per_node).run(
            args.trials
        )
    else:
        report = Campaign(nodes=args.nodes, ranks=args.ranks, seed=args.seed).run(
            args.trials, args.ops, tuple(args.always)
        )
    report["seed"] = args.seed
    report["wall_s"] = round(time.time() - started, 1)
    print(json.dumps({k: v for k, v in report.items() if k != "violation_details"}, indent=2))
    for line in report["violation_details"]:
        print("VIOLATION", line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if report["violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
