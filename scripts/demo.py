"""The ray_ckpt demo: a Ray Train job that loses nodes and recovers from peer memory.

On one machine, with no arguments: starts a simulated Ray cluster (a head plus several
one-CPU nodes, dashboard off, its own temp dir), trains a small transformer language model on
a generated corpus with ``TorchTrainer`` (DDP over gloo), first once without failures or
checkpoints (the reference for bit-exactness and for the step time without checkpoints), then
with ray_ckpt RS(2,2) at the interval ``CheckpointConfig(every="auto")`` picks, losing nodes
on a schedule: a planned loss an eighth through (Ray is told that one node drains with a 10 s
deadline, as a cloud's preemption notice does, and the node is hard-killed at the deadline),
then hard kills: one node halfway through the run, two at once three quarters through (never
on a node that still drains, nor within seconds of the drained node's kill). The same
failures hit three modes. ``in_place``: ray_ckpt with ``InPlaceRecovery``; Ray Train
replaces only the lost workers, survivors keep their processes and roll back from their local
copy, replacements restore from peers (in a warm spare process
when Ray schedules them where one waits: "(warm)" in the sources column). ``full_restart``:
ray_ckpt alone; Ray Train restarts the whole worker group and every rank resumes from peer
memory. ``ray_train``: the same job checkpointing the way Ray Train does by default
(``torch.save`` + ``ray.train.report(checkpoint=...)`` to the run's storage path), with Ray
Train's own preemption handling (a just-in-time checkpoint when ``get_preemption_info()``
reports the drain; Ray Train restarts the workers at the deadline), at an interval
estimated to cost, per step, the stall of a ray_ckpt save every step (each report taken as two
controller polls, which is what a report costs when reports come faster than the controller
polls; the measured stalls are printed, and ``scripts/bench_goodput.py`` compares at the
measured equal stall). The report shows, per mode and failure, its kind (crash or drain),
the time to resume and its phases, the steps lost (for a drain: the steps redone, and the
longest time no step was done), each rank's restore source and whether the survivors kept
their processes; per mode, the steps saved and the intervals chosen, the time lost to the
failures (``wasted_s``: until back where it was at the kill; for a drain, its longest stop
and the steps redone), what checkpointing added to the steps, the wall time and the goodput
(steps per wall second), and which mode's is highest; and checks that the final models equal
the uninterrupted run's, bit for bit.

    python scripts/demo.py [--steps 200] [--json PATH] [--events PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import pathlib
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ray_ckpt.core.timeline import Recovery

SEQ_LEN = 32
BATCH = 8
AUTO = {"data_shards": 2, "parity_shards": 2, "every": "auto"}  # ray_ckpt picks the interval


# ---- the model and its data (deterministic: same seed, same bytes) -------------------------------


def corpus(sentences: int = 4000, seed: int = 0) -> str:
    """A small generated English-like corpus (nothing is downloaded)."""
    import random

    rng = random.Random(seed)
    nouns = ["cat", "dog", "node", "rank", "shard", "model", "step", "loss", "tensor", "worker", "cluster", "parity"]
    verbs = ["sees", "saves", "loads", "trains", "restores", "encodes", "sends", "keeps", "finds", "heals"]
    adjectives = ["quick", "lazy", "big", "small", "fast", "slow", "fresh", "stale", "bright", "quiet"]
    lines = []
    for _ in range(sentences):
        lines.append(f"the {rng.choice(adjectives)} {rng.choice(nouns)} {rng.choice(verbs)} the {rng.choice(nouns)}.")
    return " ".join(lines)


def build_model(vocab: int) -> Any:
    import torch

    class TinyLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, 64)
            self.position = torch.nn.Parameter(torch.zeros(SEQ_LEN, 64))
            layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
            self.blocks = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(64, vocab)
            mask = torch.triu(torch.full((SEQ_LEN, SEQ_LEN), float("-inf")), diagonal=1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            hidden = self.embed(tokens) + self.position
            return self.head(self.blocks(hidden, mask=self.mask, is_causal=True))

    torch.manual_seed(0)
    return TinyLM()


def batch(data: Any, step: int, rank: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(step * 7919 + rank)
    starts = torch.randint(0, len(data) - SEQ_LEN - 1, (BATCH,), generator=generator)
    x = torch.stack([data[s : s + SEQ_LEN] for s in starts])
    y = torch.stack([data[s + 1 : s + SEQ_LEN + 1] for s in starts])
    return x, y


def train_loop(config: dict[str, Any]) -> None:
    """One worker: restore, then train; checkpoint with ray_ckpt or, as the baseline, the
    Ray Train way (torch.save + ray.train.report) every ``baseline_every`` steps."""
    import ray
    import ray.train
    import ray.train.collective  # not imported by ray.train itself
    import ray.train.torch
    import torch

    import ray_ckpt
    from ray_ckpt.core import events
    from ray_ckpt.testing import busy, params_digest
    from ray_ckpt.transport import naming

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.environ.update(config.get("env", {}))  # ray_ckpt settings of this run (benchmarks compare paths)
    context = ray.train.get_context()
    rank = context.get_world_rank()
    text = corpus()
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
    model = ray.train.torch.prepare_model(build_model(len(vocab)))
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    registry = naming.registry_handle(ray_ckpt.settings.namespace())
    job = context.get_experiment_name()
    node_id = ray.get_runtime_context().get_node_id()
    mode = config["mode"]

    def record(kind: str, step: int, **fields: Any) -> None:
        """An event of this rank's attempt (``attempt``, set below before any) to the registry."""
        registry.record.remote(
            events.event(kind, job=job, rank=rank, attempt=attempt, node_id=node_id, step=step, **fields)
        )

    # an optional stand-in for a larger model's parameters and optimizer state: saved and
    # restored by both kinds of checkpointing, one element changed every step; drawn only when
    # nothing was restored, as a trainer that restores skips initializing what it loads
    pad: torch.Tensor | None = None
    start = 0
    ckpt = None
    work_began = time.time()  # what checkpointing can cost from here on: setup, restore, steps, the final wait
    if mode == "ray_ckpt":
        ckpt = ray_ckpt.train.Checkpointer(ray_ckpt.CheckpointConfig(**config["checkpoint"]))
        attempt = ckpt.attempt
        restored = ckpt.restore()
        if restored is not None:
            model.load_state_dict(restored.state["model"])
            optim.load_state_dict(restored.state["optim"])
            pad = restored.state["pad"]
            start = restored.step + 1
    else:
        created = time.time()
        attempt = ray.train.collective.broadcast_from_rank_zero(uuid.uuid4().hex)
        began = time.perf_counter()
        checkpoint = ray.train.get_checkpoint()
        t1 = time.perf_counter()
        if checkpoint is not None:
            with checkpoint.as_directory() as folder:
                t1 = time.perf_counter()
                state = torch.load(pathlib.Path(folder) / "state.pt", weights_only=True)
            model.load_state_dict(state["model"])
            optim.load_state_dict(state["optim"])
            pad = state["pad"]
            start = state["step"] + 1
        # recorded at every start, so that a restart from scratch shows up as a recovery too
        record(
            "restore",
            start - 1,  # -1: no checkpoint yet, started from scratch
            source="storage" if checkpoint is not None else "scratch",
            steps_lost=None,
            bytes=0,
            pid=os.getpid(),
            started=created,
            phases_s={"locate": t1 - began, "fetch": 0.0, "decode": 0.0, "load": time.perf_counter() - t1},
        )
    if pad is None:
        drawn = time.time()
        pad = torch.rand(config.get("state_mib", 0) << 18, generator=torch.Generator().manual_seed(rank))
        work_began += time.time() - drawn  # the draw is the model's setup, not checkpointing
    # compute "sleep": the step's compute is a sleep of compute_s (as if on a GPU), so only the
    # checkpointing uses the CPU; "busy": compute_s of CPU work comes before the model's step
    sleep_compute = config.get("compute") == "sleep"
    busy_s = config["compute_s"] if config.get("compute") == "busy" else 0.0
    loss = torch.zeros(())
    step_ends: list[float] = []
    saved_on_notice = False  # the baseline's just-in-time checkpoint on a preemption notice
    for step in range(start, config["steps"]):
        if sleep_compute:
            time.sleep(config["compute_s"])
        else:
            busy(busy_s)
            x, y = batch(data, step, rank)
            optim.zero_grad()
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            optim.step()
        if pad.numel():
            pad[step % pad.numel()] += 1.0
        began = time.perf_counter()
        if ckpt is not None:  # called every step: CheckpointConfig(every=...) says which steps it saves
            handle = ckpt.save(step, {"model": model.state_dict(), "optim": optim.state_dict(), "pad": pad})
            if handle.skipped:  # ray_ckpt records the steps it saves; the kills and step times need every step
                blocking = {"blocking": time.perf_counter() - began}
                record("save", step, phases_s=blocking, bytes=0, returned=time.time(), skipped=True)
        else:
            stall = 0.0
            due = bool(config["baseline_every"]) and (step + 1) % config["baseline_every"] == 0
            check = config.get("preemption_check_every", 0)
            if check and not saved_on_notice and (step + 1) % check == 0:
                # Ray Train's own preemption handling, as its docs recommend: on a notice, a
                # just-in-time checkpoint, then train on; at the deadline Ray Train restarts the
                # workers from the latest checkpoint. The check is a barrier of every worker.
                if ray.train.get_preemption_info() is not None:
                    due = saved_on_notice = True
                stall = time.perf_counter() - began
            if due:
                with tempfile.TemporaryDirectory() as folder:
                    torch.save(
                        {"model": model.state_dict(), "optim": optim.state_dict(), "pad": pad, "step": step},
                        pathlib.Path(folder) / "state.pt",
                    )
                    ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(folder))
                stall = time.perf_counter() - began
            record("save", step, phases_s={"blocking": stall}, bytes=0)
        time.sleep(config["step_sleep_s"])
        step_ends.append(time.time())
    if ckpt is not None:
        ckpt.wait()
        ckpt.close()
    final = {
        "rank": rank,
        "params_digest": params_digest(model),
        "loss": float(loss),
        "step_ends": step_ends,
        "work_s": time.time() - work_began,
    }
    (pathlib.Path(config["out_dir"]) / f"final-{rank}.json").write_text(json.dumps(final))


# ---- orchestration --------------------------------------------------------------------------------


DRAIN_DEADLINE_S = 10.0  # a drain's notice -> the node's end, as a cloud's reclaim notice gives
# the Ray Train baseline asks ray.train.get_preemption_info() (a barrier) every this many steps:
# about every 0.75 s here, well inside Ray Train's own 5 s poll of the drains
PREEMPTION_CHECK_EVERY = 10
# no other failure within this long of a drain's kill at its deadline: that kill is a burst of
# its own (ray_ckpt.core.timeline.BURST_S apart from the next)
DRAIN_QUIET_S = 2.5


class Failure(NamedTuple):
    """One scheduled failure: once ``step`` is done, the nodes of ``ranks`` and ``extra``
    shard-holder nodes are lost. kind "crash": hard-killed at once; "drain": Ray is told they
    drain with a deadline ``DRAIN_DEADLINE_S`` away (a preemption notice), and they are
    hard-killed at the deadline."""

    step: int
    ranks: list[int]
    extra: int = 0
    kind: str = "crash"


class Killer(threading.Thread):
    """Watches the job's save events and strikes when given steps are reached (``schedule``, a
    list of ``Failure``). With ``delay_s`` > 0 each strike comes a seeded uniform 0..delay_s
    seconds after its step's save returned (or at once, if that time has passed), i.e. at a
    random point of the next step, as a real failure would. A drain's kill at its deadline runs
    on a thread of its own; ``finish`` waits for it."""

    def __init__(
        self,
        cluster: Any,
        job: str,
        schedule: Sequence[Failure | tuple[int, list[int], int]],
        delay_s: float = 0.0,
        seed: int = 0,
    ) -> None:
        super().__init__(daemon=True)
        # a plain (step, ranks, extra) tuple is a crash (the benchmarks' schedules)
        self.cluster, self.job = cluster, job
        self.schedule = [f if isinstance(f, Failure) else Failure(*f) for f in schedule]
        self.delay_s, self.rng = delay_s, random.Random(seed)
        self.kills: list[dict[str, Any]] = []
        self.drains: list[dict[str, Any]] = []  # {"nodes", "time" (the notice), "deadline"}
        self.error: BaseException | None = None
        self._deadline_kills: list[threading.Thread] = []

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # reported by the demo
            self.error = error

    def finish(self, timeout_s: float) -> None:
        """Wait for the schedule's strikes, a pending drain's kill at its deadline included."""
        self.join(timeout=timeout_s)
        for thread in self._deadline_kills:
            thread.join(timeout=DRAIN_DEADLINE_S + timeout_s)

    def _run(self) -> None:
        import ray

        import ray_ckpt
        from ray_ckpt.core import events
        from ray_ckpt.transport import naming

        registry = naming.registry_handle(ray_ckpt.settings.namespace())
        cursor = 0
        nodes_of: dict[int, str] = {}
        holders: list[str] = []
        # failures do not overlap: the next strikes only once every rank it names was seen saving
        # after the last strike, not on a node that drains, and not within DRAIN_QUIET_S of a
        # drain's kill at its deadline (a burst of its own)
        quiet_until = 0.0
        fresh: set[int] = set()

        def blocked(failure: Failure) -> bool:
            now = time.time()
            for drain in self.drains:
                if abs(now - drain["deadline"]) <= DRAIN_QUIET_S:
                    return True
                if now < drain["deadline"] and any(nodes_of.get(r) in drain["nodes"] for r in failure.ranks):
                    return True
            return False

        while self.schedule:
            cursor, batch_ = ray.get(registry.events.remote(cursor))
            struck = max((d.get("struck", 0.0) for d in self.drains), default=0.0)
            if struck > quiet_until:  # a drained node is gone: where the ranks run is seen anew
                quiet_until, fresh = struck, set()
            for record in batch_:
                if record["kind"] == "save" and record.get("job") == self.job and float(record["time"]) >= quiet_until:
                    nodes_of[int(record["rank"])] = record["node_id"]
                    fresh.add(int(record["rank"]))
                    step = int(record["step"])
                    upcoming = self.schedule[0] if self.schedule else None
                    if upcoming and step >= upcoming.step and fresh >= set(upcoming.ranks) and not blocked(upcoming):
                        failure = self.schedule.pop(0)
                        # ray_ckpt logs a save once it committed; the step was done when save() returned
                        done = float(record.get("returned", record["time"]))
                        time.sleep(max(0.0, done + self.rng.uniform(0.0, self.delay_s) - time.time()))
                        victims = {nodes_of[r] for r in failure.ranks if r in nodes_of}
                        holders = self._shard_holders(registry)
                        for node_id in holders:
                            if len(victims) >= len(failure.ranks) + failure.extra:
                                break
                            victims.add(node_id)
                        if failure.kind == "drain":
                            self._drain(sorted(victims), registry, events)
                        else:
                            self._kill(sorted(victims), registry, events)
                        quiet_until = time.time()
                        fresh = set()
            time.sleep(0.05)

    def _drain(self, victims: list[str], registry: Any, events: Any) -> None:
        """Tell Ray the nodes drain (as ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION``
        and a cloud's reclaim notice do), then kill them at the deadline on a thread."""
        from ray_ckpt import _ray_compat

        notice = time.time()
        deadline = notice + DRAIN_DEADLINE_S
        for node_id in victims:
            refused = _ray_compat.drain_node(node_id, deadline, f"demo: a drain with a {DRAIN_DEADLINE_S:g} s deadline")
            if refused is not None:
                raise RuntimeError(f"Ray refused the drain of node {node_id}: {refused}")
            registry.record.remote(
                events.event("kill", node_id=node_id, mode="drain", by="demo", time=notice, deadline=deadline)
            )
        drain: dict[str, Any] = {"nodes": victims, "time": notice, "deadline": deadline}
        self.drains.append(drain)

        def at_deadline() -> None:
            time.sleep(max(0.0, deadline - time.time()))
            try:
                self._kill(victims, registry, events)
            except BaseException as error:  # reported by the demo
                self.error = error
            drain["struck"] = time.time()  # the nodes are gone (or the kill failed)

        thread = threading.Thread(target=at_deadline, daemon=True)
        thread.start()
        self._deadline_kills.append(thread)

    def _shard_holders(self, registry: Any) -> list[str]:
        import ray

        workers = sorted(n.node_id for n in self.cluster.worker_nodes)
        latest = ray.get(registry.latest_committed.remote(self.job))
        if latest is None:  # the baseline keeps nothing in peers: any other node will do
            return workers
        located = ray.get(registry.locate.remote(self.job, latest))
        return [n for r in sorted(located) for n in located[r]["nodes"].values() if n in workers]

    def _kill(self, victims: list[str], registry: Any, events: Any) -> None:
        from ray_ckpt.transport import naming

        killed_at = time.time()
        for node in [n for n in self.cluster.worker_nodes if n.node_id in victims]:
            registry.record.remote(events.event("kill", node_id=node.node_id, mode="node", by="demo"))
            self.cluster.remove_node(node, allow_graceful=False)
        while naming.alive_node_ids() & set(victims):
            time.sleep(0.02)
        dead_at = time.time()
        for node_id in victims:
            registry.record.remote(events.event("node_dead", node_id=node_id, time=dead_at))
        self.kills.append({"nodes": victims, "time": killed_at, "dead_time": dead_at})


def run_job(
    cluster: Any,
    name: str,
    mode: str,
    steps: int,
    kills: Sequence[Failure | tuple[int, list[int], int]],
    kill_delay_s: float = 0.0,
    in_place: bool = False,
    max_failures: int = 6,
    warm_spares: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import ray_ckpt

    out_dir = tempfile.mkdtemp(prefix="rckdemo-out")
    killer = Killer(cluster, name, kills, delay_s=kill_delay_s)
    killer.start()
    began = time.time()
    spares = {} if warm_spares is None else {"warm_spares": warm_spares}
    recovery = ray_ckpt.train.InPlaceRecovery(**spares) if in_place else None
    TorchTrainer(
        train_loop if recovery is None else recovery.wrap(train_loop),
        torch_config=recovery,
        train_loop_config={
            "mode": mode,
            "steps": steps,
            "out_dir": out_dir,
            "checkpoint": {"data_shards": 2, "parity_shards": 2},
            "step_sleep_s": 0.05,
            **extra,
        },
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=name,
            storage_path=extra.get("storage", tempfile.mkdtemp()),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    ).fit()
    wall_s = time.time() - began
    killer.finish(timeout_s=5)
    if killer.error is not None:
        raise killer.error
    final = json.loads((pathlib.Path(out_dir) / "final-0.json").read_text())
    return {"final": final, "wall_s": wall_s, "began": began, "kills": killer.kills, "drains": killer.drains}


def job_events(name: str) -> list[dict[str, Any]]:
    import ray

    import ray_ckpt
    from ray_ckpt.transport import naming

    _, records = ray.get(naming.registry_handle(ray_ckpt.settings.namespace()).events.remote(0))
    return [r for r in records if r.get("job") in (name, None) or r["kind"] in ("kill", "node_dead")]


def failures_report(
    name: str, records: list[dict[str, Any]], drains: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """One entry per recovery after a kill. ``kind``: "drain" when the nodes lost had been
    drained (``drains``, the Killer's: in place the recovery is the handover after the notice,
    with a restart it follows the kill at the deadline), else "crash". A drain's entry also has
    ``notice_s`` (the notice -> the kill the recovery followed: 0 in place) and ``stall_s``: the
    longest time rank 0 did no step, from the notice until the recovery's first step."""
    from ray_ckpt.core import timeline

    result = []
    saves = [r for r in records if r["kind"] == "save" and r.get("job") == name]
    for recovery in timeline.recoveries([r for r in records if r.get("job", name) == name]):
        if recovery.kill_time is None:  # the baseline's first start, not a failure
            continue
        kill_time = recovery.kill_time
        drain = next(
            (d for d in drains or [] if set(d["nodes"]) & set(recovery.killed_nodes) and d["time"] <= kill_time + 1e-3),
            None,
        )
        kind = "crash" if drain is None else "drain"
        if recovery.failed:  # a restart whose restore raised: a failure, with its error
            errors = sorted(set(recovery.errors.values()))
            result.append(
                {"kind": kind, "failed": True, "errors": errors, "killed_nodes": [n[:8] for n in recovery.killed_nodes]}
            )
            continue
        done = sorted(
            (s for s in saves if float(s.get("returned", s["time"])) <= kill_time),
            key=lambda s: float(s.get("returned", s["time"])),
        )
        # the steps the attempt running at the kill had done (an earlier attempt may have gone further)
        running = str(done[-1].get("attempt")) if done else None
        before = [int(s["step"]) for s in done if str(s.get("attempt")) == running]
        newest = max(before) if before else recovery.step
        done_at = [float(s.get("returned", s["time"])) for s in done if before and int(s["step"]) == newest]
        pids_before, pids_after = _survivor_pids(name, records, recovery)
        drain_fields: dict[str, Any] = {}
        if drain is not None and recovery.time_to_resume_s is not None:
            resumed = kill_time + recovery.time_to_resume_s
            drain_fields = {
                "notice_s": kill_time - drain["time"],
                "stall_s": longest_gap(name, records, drain["time"], resumed),
            }
        result.append(
            {
                "kind": kind,
                **drain_fields,
                "mode": recovery.mode,
                "survivor_pids_before": pids_before,
                "survivor_pids_after": pids_after,
                "time_to_resume_s": recovery.time_to_resume_s,
                "training_again_s": training_again_s(recovery),
                "steps_lost": max(0, newest - recovery.step),
                "into_step_s": kill_time - max(done_at) if done_at else None,
                "restored_step": recovery.step,
                "phases": dict(recovery.phases_s),
                "sources": dict(recovery.sources),
                "warm": dict(recovery.warm_replacements),
                "killed_nodes": [n[:8] for n in recovery.killed_nodes],
            }
        )
    return result


def rank0_step_ends(name: str, records: list[dict[str, Any]]) -> list[float]:
    """When each of rank 0's steps of job ``name`` was done (its save() returned), in order."""
    return sorted(
        float(r.get("returned", r["time"]))
        for r in records
        if r["kind"] == "save" and r.get("job") == name and int(r.get("rank", -1)) == 0
    )


def longest_gap(name: str, records: list[dict[str, Any]], start: float, end: float) -> float:
    """The longest time rank 0 finished no step between ``start`` and ``end`` (Unix seconds):
    the gaps between its steps' ends (save() returned), and from ``start`` to the first."""
    inside = [start] + [t for t in rank0_step_ends(name, records) if start < t <= end + 1e-3]
    return max((b - a for a, b in itertools.pairwise(inside)), default=end - start)


def training_again_s(recovery: Recovery) -> float | None:
    """Kill -> training runs again (the slowest rank's restore done, its first step begins):
    the time to resume without that first step, which redoes a step lost at the kill."""
    first_step = recovery.phases_s.get("first_step")
    if recovery.time_to_resume_s is None or first_step is None:
        return None
    return recovery.time_to_resume_s - first_step


def _survivor_pids(
    name: str, records: list[dict[str, Any]], recovery: Recovery
) -> tuple[dict[str, int], dict[str, int]]:
    """The pids, before and after ``recovery``, of the ranks whose node was not killed."""
    restores = [r for r in records if r["kind"] == "restore" and r.get("job") == name and r.get("pid")]
    after = {str(r["rank"]): (r["pid"], r.get("node_id")) for r in restores if r.get("attempt") == recovery.attempt}
    earlier = [r for r in restores if float(r["time"]) < float(recovery.kill_time)]
    before: dict[str, tuple[int, str | None]] = {}
    for record in earlier:  # the newest attempt before the kill
        if record.get("attempt") == earlier[-1].get("attempt"):
            before[str(record["rank"])] = (record["pid"], record.get("node_id"))
    killed = set(recovery.killed_nodes)
    survivors = [rank for rank, (_, node) in before.items() if node not in killed]
    return (
        {rank: before[rank][0] for rank in sorted(survivors)},
        {rank: after[rank][0] for rank in sorted(survivors) if rank in after},
    )


def mean_stall(name: str, records: list[dict[str, Any]], first_step: int = 0) -> float:
    """Mean save stall per training step, of the steps from ``first_step`` on (the baseline
    stalls only on checkpoint steps)."""
    stalls = [
        float(r["phases_s"]["blocking"])
        for r in records
        if r["kind"] == "save"
        and r.get("job") == name
        and "blocking" in r.get("phases_s", {})
        and int(r["step"]) >= first_step
    ]
    return sum(stalls) / len(stalls) if stalls else 0.0


def saves_made(name: str, records: list[dict[str, Any]]) -> dict[str, float]:
    """Rank 0's saved (not skipped) steps: how many, and their median blocking time."""
    blocking = [
        float(r["phases_s"]["blocking"])
        for r in records
        if r["kind"] == "save" and r.get("job") == name and int(r.get("rank", -1)) == 0 and not r.get("skipped")
    ]
    return {"count": len(blocking), "blocking_s": statistics.median(blocking) if blocking else 0.0}


def intervals_chosen(name: str, records: list[dict[str, Any]]) -> str:
    """The intervals rank 0's every="auto" chose, in order, each with its reason."""
    chosen = [
        f"{r['interval']} ({r['reason']})"
        for r in records
        if r["kind"] == "interval" and r.get("job") == name and int(r.get("rank", -1)) == 0
    ]
    return " -> ".join(chosen)


def start_time(name: str, records: list[dict[str, Any]], began: float) -> float:
    """Seconds from the fit's start (``began``) to rank 0's first step done: the workers' start
    (and, in place, the warm spares' warm-up it waits for, ``InPlaceRecovery(await_spares_s)``)."""
    ends = rank0_step_ends(name, records)
    return ends[0] - began if ends else float("nan")


def step_time(name: str, records: list[dict[str, Any]]) -> float:
    """Median seconds between consecutive steps of rank 0 within one attempt."""
    saves: dict[str, dict[int, float]] = {}
    for r in records:
        if r["kind"] == "save" and r.get("job") == name and int(r.get("rank", -1)) == 0:
            saves.setdefault(str(r.get("attempt")), {})[int(r["step"])] = float(r.get("returned", r["time"]))
    gaps = [times[s + 1] - times[s] for times in saves.values() for s in sorted(times) if s + 1 in times]
    return statistics.median(gaps) if gaps else float("nan")


def wasted_s(failure: dict[str, Any], step_s: float) -> float | None:
    """Seconds one failure cost the job: from the kill until the job is back where it was at
    the kill. That is the time to resume (kill -> the first step after the restore done), plus
    the steps lost and the part of a step in progress at the kill (``into_step_s``, at most a
    step), less the first step after the restore, which redoes one of them: ``resume +
    (steps_lost - 1) x step + into_step``. None when the failure did not resume."""
    resume = failure.get("time_to_resume_s")
    if resume is None or failure.get("failed"):
        return None
    if failure.get("kind") == "drain" and failure.get("stall_s") is not None:
        # the job trained on after the notice: what it lost is its longest stop, less the step
        # that stop held anyway, plus the steps it redid
        return max(0.0, float(failure["stall_s"]) - step_s) + int(failure["steps_lost"]) * step_s
    into = min(step_s, max(0.0, float(failure.get("into_step_s") or 0.0)))
    return float(resume) + (int(failure["steps_lost"]) - 1) * step_s + into


def time_lost(failures: list[dict[str, Any]], step_s: float) -> float:
    """Seconds the failures cost (``wasted_s`` of each)."""
    return sum(wasted_s(f, step_s) or 0.0 for f in failures)


TABLE_PHASES = ("detect", "restart", "replace", "rendezvous", "locate", "fetch", "decode", "load", "first_step")


def print_failures(title: str, failures: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    head = f"  {'#':>2} {'kind':<5} {'resume s':>8} {'lost':>4} {'step':>4}  " + " ".join(
        f"{p[:8]:>8}" for p in TABLE_PHASES
    )
    print(head + "  sources; survivors' processes")
    for i, f in enumerate(failures, 1):
        if f.get("failed"):
            print(f"  {i:>2} {f.get('kind', 'crash'):<5} FAILED to restore: {'; '.join(f['errors'])}")
            continue
        phases = f["phases"]
        cells = " ".join(f"{phases.get(p):>8.2f}" if phases.get(p) is not None else f"{'-':>8}" for p in TABLE_PHASES)
        resume = f["time_to_resume_s"]
        warm = f.get("warm", {})
        sources = ", ".join(f"r{r}:{s}{' (warm)' if warm.get(r) else ''}" for r, s in sorted(f["sources"].items()))
        kept = f["survivor_pids_before"] and f["survivor_pids_before"] == f["survivor_pids_after"]
        survivors = "kept" if kept else ("new" if f["survivor_pids_before"] else "none survived")
        sources = f"{sources}; {survivors}"
        resume_text = f"{resume:>8.2f}" if resume is not None else f"{'-':>8}"
        kind = f.get("kind", "crash")
        print(f"  {i:>2} {kind:<5} {resume_text} {f['steps_lost']:>4} {f['restored_step']:>4}  {cells}  {sources}")
    for i, f in enumerate(failures, 1):
        if f.get("kind") == "drain" and f.get("stall_s") is not None:
            print(
                f"  #{i} drain: {f['steps_lost']} step(s) redone; rank 0 did no step for {f['stall_s']:.2f} s at most "
                f"from the notice until training went on (resume s counts from the notice in place, from the "
                f"node's end at the deadline after a restart: {f['notice_s']:.1f} s after the notice here)"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--nodes", type=int, default=7, help="simulated one-CPU worker nodes (default 7)")
    parser.add_argument("--json", type=pathlib.Path, help="write the report as JSON here")
    parser.add_argument("--events", type=pathlib.Path, help="also write all recorded events (JSON lines) here")
    args = parser.parse_args(argv)
    if args.steps < 30:
        parser.error("--steps must be >= 30 (failures are scheduled at 1/2 and 3/4 of the run)")
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rckdemo"))
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    os.environ["RAY_CKPT_SAVE_EVENT_EVERY"] = "1"
    # every="auto" assumes this mean time between failures until the job has seen one: about the
    # demo's own rate (a cluster's history gives a real job's; the default is an hour)
    os.environ.setdefault("RAY_CKPT_AUTO_MTBF_S", "30")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray_ckpt
    from ray_ckpt.core import events
    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.tools import quiet

    # a drain an eighth in, its deadline well before the end in every mode (in place and Ray Train
    # train on until it); the crashes halfway and three quarters in (a job's first seconds, before
    # its warm spares are up, are not when crashes come), never on a node that still drains
    drained, first, second = args.steps // 8, args.steps // 2, args.steps * 3 // 4
    schedule = [
        Failure(drained, [1], kind="drain"),  # rank 1's node drains, and goes at the deadline
        Failure(first, [1]),  # rank 1's node crashes
        Failure(second, [0], extra=1),  # rank 0's node and a shard holder crash at once
    ]
    lost_nodes = sum(len(f.ranks) + f.extra for f in schedule)
    print(f"starting a simulated Ray cluster: a head + {args.nodes} one-CPU nodes ...", flush=True)
    sim = SimulatedCluster(args.nodes, start_service=False, logging_level="ERROR")
    cluster = sim.cluster
    try:
        quiet.quiet_driver()  # Ray's messages about the nodes killed below stay in its logs
        ray_ckpt.start(store_budget_bytes=1 << 30)
        print(f"1/4 uninterrupted reference run without checkpoints, {args.steps} steps ...", flush=True)
        reference = run_job(cluster, "reference", "baseline", args.steps, [], baseline_every=0)
        reference_step_s = step_time("reference", job_events("reference"))
        kills = (
            f"drain rank 1's node after step {drained} ({DRAIN_DEADLINE_S:g} s deadline, then killed), kill rank "
            f"1's node after step {first}, then rank 0's node and a shard holder at once after step {second}"
        )
        modes: dict[str, dict[str, Any]] = {}
        records: list[dict[str, Any]] = []
        for number, (name, title, in_place) in enumerate(
            (("in_place", "in place (InPlaceRecovery)", True), ("full_restart", "full restart", False)), 2
        ):
            print(f'{number}/4 ray_ckpt {title}, RS(2,2), every="auto"; {kills} ...', flush=True)
            run = run_job(cluster, name, "ray_ckpt", args.steps, schedule, in_place=in_place, checkpoint=AUTO)
            job_records = job_events(name)
            records += [r for r in job_records if r not in records]
            modes[name] = {
                "failures": failures_report(name, job_records, run["drains"]),
                "wall_s": run["wall_s"],
                "start_s": start_time(name, job_records, run["began"]),
                "save_stall_s": mean_stall(name, job_records),
                "saves": saves_made(name, job_records),
                "intervals": intervals_chosen(name, job_records),
                "step_s": step_time(name, job_records),
                "bit_exact": run["final"]["params_digest"] == reference["final"]["params_digest"],
            }
            sim.add_workers(lost_nodes)  # replace the nodes killed above
            ray_ckpt.start()
        # the baseline checkpoints at the interval estimated to match ray_ckpt's stall per step
        # when saving every step (its stall per save), each report taken as two controller polls
        # (its cost when reports queue up); both measured stalls are printed at the end
        ours_stall = modes["full_restart"]["saves"]["blocking_s"]
        report_stall_s = 2 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2"))
        baseline_every = max(1, min(args.steps // 3, math.ceil(report_stall_s / max(ours_stall, 1e-4))))
        print(
            f"4/4 Ray Train default checkpointing (torch.save + report) every {baseline_every} steps and on a "
            f"preemption notice (checked every {PREEMPTION_CHECK_EVERY} steps), same failures ...",
            flush=True,
        )
        baseline = run_job(
            cluster,
            "ray_train",
            "baseline",
            args.steps,
            schedule,
            baseline_every=baseline_every,
            preemption_check_every=PREEMPTION_CHECK_EVERY,
        )
        base_records = job_events("ray_train")
        records += [r for r in base_records if r not in records]
        modes["ray_train"] = {
            "failures": failures_report("ray_train", base_records, baseline["drains"]),
            "wall_s": baseline["wall_s"],
            "start_s": start_time("ray_train", base_records, baseline["began"]),
            "save_stall_s": mean_stall("ray_train", base_records),
            "step_s": step_time("ray_train", base_records),
            "bit_exact": None,  # restarts from an older checkpoint: not comparable step for step
        }
        print_failures(
            "ray_ckpt in place (survivors keep running, only lost ranks are replaced):", modes["in_place"]["failures"]
        )
        print_failures("ray_ckpt with a full restart of the worker group:", modes["full_restart"]["failures"])
        print_failures(
            f"Ray Train default checkpointing (every {baseline_every} steps):", modes["ray_train"]["failures"]
        )
        for name in ("in_place", "full_restart"):
            made = modes[name]["saves"]
            chosen = modes[name]["intervals"] or "no interval recorded"
            print(
                f'\n{name}: {made["count"]} of {args.steps} steps saved (every="auto": {chosen}), '
                f"{made['blocking_s'] * 1e3:.1f} ms blocking per save"
            )
        print(
            f"save stall per training step, mean: in place {modes['in_place']['save_stall_s'] * 1e3:.1f} ms, "
            f"full restart {modes['full_restart']['save_stall_s'] * 1e3:.1f} ms; Ray Train "
            f"{modes['ray_train']['save_stall_s'] * 1e3:.1f} ms (a checkpoint every {baseline_every} steps)"
        )
        print(
            f"\ngoodput against the uninterrupted run without checkpoints ({reference['wall_s']:.1f} s, "
            f"median step {reference_step_s:.3f} s):"
        )
        for name, mode in modes.items():
            lost = time_lost(mode["failures"], mode["step_s"])
            overhead = max(0.0, mode["step_s"] - reference_step_s) * args.steps
            mode.update(time_lost_s=lost, overhead_s=overhead, goodput=args.steps / mode["wall_s"])
            print(
                f"  {name:<13} wall {mode['wall_s']:6.1f} s ({mode['start_s']:.1f} s to its first step), "
                f"goodput {mode['goodput']:.2f} steps/s; "
                f"median step {mode['step_s']:.3f} s (checkpointing adds {overhead:.1f} s over the run), "
                f"lost to the {len(schedule)} failures {lost:.1f} s"
            )
        best = max(modes, key=lambda name: modes[name]["goodput"])
        print(
            f"highest goodput: {best}; every simulated node shares this machine's {os.cpu_count()} cores, so "
            "the background work of a save competes with training here as it would not on a GPU node, and in "
            "place the warm spares of every free node import torch one after another before the first step "
            "(on a cluster each node warms its own, during the workers' start)"
        )
        ours = modes["in_place"]["failures"] + modes["full_restart"]["failures"]
        all_from_memory = all(
            not f.get("failed") and all(s in ("local", "peers") for s in f["sources"].values()) for f in ours
        )
        print("every ray_ckpt failure recovered from peer memory" if all_from_memory else "SOME failure fell back")
        planned = [f for f in ours if f.get("kind") == "drain"]
        drains_redo_nothing = all(not f.get("failed") and f["steps_lost"] == 0 for f in planned)
        theirs = [str(f.get("steps_lost")) for f in modes["ray_train"]["failures"] if f.get("kind") == "drain"]
        print(
            f"the drain redid 0 steps in both ray_ckpt modes (Ray Train: {', '.join(theirs) or 'no recovery'})"
            if drains_redo_nothing
            else "A DRAIN REDID STEPS in a ray_ckpt mode"
        )
        bit_exact = bool(modes["in_place"]["bit_exact"] and modes["full_restart"]["bit_exact"])
        print(
            "final models of both ray_ckpt modes bit-identical to the uninterrupted run"
            if bit_exact
            else "MISMATCH: a final model differs from the uninterrupted run"
        )
        report = {
            "modes": modes,
            "failures": modes["full_restart"]["failures"],
            "baseline_failures": modes["ray_train"]["failures"],
            "baseline_every": baseline_every,
            "save_stall_s": {"ray_ckpt_per_save": ours_stall, "baseline": modes["ray_train"]["save_stall_s"]},
            "reference": {"wall_s": reference["wall_s"], "step_s": reference_step_s},
            "bit_exact": bit_exact,
        }
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2))
        if args.events:
            args.events.parent.mkdir(parents=True, exist_ok=True)
            events.write(args.events, records)
            print(f"events written to {args.events}; view them with: ray-ckpt dashboard --events {args.events}")
        print(f"Ray's own logs of this run (node deaths, worker restarts): {quiet.logs_dir()}")
        ok = (
            bit_exact
            and all_from_memory
            and drains_redo_nothing
            and len(planned) == 2
            and all(len(modes[m]["failures"]) == len(schedule) for m in ("in_place", "full_restart"))
        )
        return 0 if ok else 1
    finally:
        sim.shutdown()


if __name__ == "__main__":
    sys.exit(main())
