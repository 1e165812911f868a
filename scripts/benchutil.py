"""The benchmark scripts' harness: errors, flags, a run on a private Ray temp dir and its logs,
node pinning, the restore benchmarks' cluster, killing nodes, tables, JSON, figures. Each script
keeps only what it measures.

Importing it loads no Ray (scale_model.py, pure computation, uses the flags, tables and JSON).
Setting a run's Ray temp dir up (``private_ray_tmpdir``, which a script does before it starts
Ray) registers this module with Ray's pickler by value: the scripts' actors (defined in
``__main__``) may refer to what is here, and Ray workers cannot import this folder.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

MIB = 1 << 20
ROOT = pathlib.Path(__file__).resolve().parents[1]
T = TypeVar("T")


class BenchError(RuntimeError):
    """A result differs from what was saved, or the cluster misbehaved: the run is void."""


def make_parser(doc: str | None, epilog: str | None = None) -> argparse.ArgumentParser:
    """A script's parser: its docstring's first line as the description."""
    return argparse.ArgumentParser(description=(doc or "").splitlines()[0], epilog=epilog)


def add_json_flag(parser: argparse.ArgumentParser, what: str = "the rows") -> None:
    """``--json PATH``: also write ``what`` as JSON."""
    parser.add_argument("--json", type=pathlib.Path, metavar="PATH", help=f"also write {what} as JSON")


def add_plots_flag(parser: argparse.ArgumentParser) -> None:
    """``--plots DIR``: where the PNGs go (default docs/img)."""
    parser.add_argument(
        "--plots", type=pathlib.Path, default=ROOT / "docs" / "img", metavar="DIR", help="PNG folder (default docs/img)"
    )


def add_steps_flags(parser: argparse.ArgumentParser, steps: int, step_sleep_s: float | None = None) -> None:
    """The training-job benchmarks' ``--steps`` (training steps per run, default ``steps``) and,
    with a default given, ``--step-sleep-s`` (extra seconds per step)."""
    parser.add_argument("--steps", type=int, default=steps, help=f"training steps per run (default {steps})")
    if step_sleep_s is not None:
        parser.add_argument(
            "--step-sleep-s", type=float, default=step_sleep_s, help=f"extra seconds per step (default {step_sleep_s})"
        )


def add_sizes_flag(parser: argparse.ArgumentParser, default: list[int], help: str) -> None:
    """``--sizes-mib LIST``: comma-separated sizes in MiB (``sizes_mib``), ``help`` verbatim."""
    parser.add_argument("--sizes-mib", type=sizes_mib, default=default, metavar="LIST", help=help)


def _pickled_by_value() -> None:
    """Register this module with Ray's pickler by value (idempotent)."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def private_ray_tmpdir(prefix: str) -> str:
    """A new Ray temp dir for this run, set as RAY_TMPDIR (Ray's processes inherit the
    environment), with usage stats off unless set; this module registered with Ray's pickler by
    value. ``prefix`` short: Ray's socket paths must stay under ~107 bytes."""
    _pickled_by_value()
    tmpdir = tempfile.mkdtemp(prefix=prefix)
    os.environ["RAY_TMPDIR"] = tmpdir
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    return tmpdir


def keep_ray_logs_unless(ok: bool, tmpdir: str) -> None:
    """After the run: delete its Ray temp dir if ``ok``, else keep it for Ray's logs and say
    where (stderr)."""
    if ok:
        shutil.rmtree(tmpdir, ignore_errors=True)
    else:
        print(f"Ray logs kept in {tmpdir}", file=sys.stderr)


def on_private_ray(prefix: str, measure: Callable[[], T], *, clean: Callable[[T], bool] = lambda _: True) -> T | None:
    """``measure()`` on a Ray temp dir of its own (``private_ray_tmpdir(prefix)``), and its
    result; None when it raised BenchError, which is said on stderr (``error: ...``): the run is
    void, the script exits 1. The temp dir is deleted when ``measure`` returned a result that
    ``clean`` accepts, else kept for Ray's logs (``keep_ray_logs_unless``); any other exception
    goes on, the logs kept."""
    tmpdir = private_ray_tmpdir(prefix)
    clean_run = False
    try:
        result = measure()
        clean_run = clean(result)
        return result
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return None
    finally:
        keep_ray_logs_unless(clean_run, tmpdir)


def write_json(path: pathlib.Path | None, document: Any, **dumps: Any) -> None:
    """``--json PATH``: ``document`` written to ``path`` (its folders made), indented, a newline
    at the end; ``dumps``: more ``json.dumps`` arguments. Nothing when ``path`` is None."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, **dumps) + "\n")


def load_demo() -> Any:
    """scripts/demo.py as a module, pickled by value so Ray workers can run its train_loop."""
    import importlib.util

    name = "ray_ckpt_demo_for_benchmarks"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "demo.py")
    if spec is None or spec.loader is None:
        raise BenchError(f"cannot load {ROOT / 'scripts' / 'demo.py'}")
    import ray.cloudpickle

    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)
    return module


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: pathlib.Path) -> None:
    """Lay ``fig`` out tight, write it to ``path`` (folders made) at 110 dpi, and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_plot(folder: pathlib.Path, name: str, draw: Callable[[pathlib.Path], None]) -> None:
    """``draw(folder / name)`` (it writes the figure there), then ``plot: <path>`` printed."""
    target = folder / name
    draw(target)
    print(f"plot: {shown(target)}")


def shown(path: pathlib.Path) -> pathlib.Path:
    """``path`` relative to the repository when it lies in it (for printing)."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def on_node(node_id: str) -> Any:
    """A scheduling strategy that pins a task or actor to ``node_id`` (hard)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def restore_cluster(workers: int, size: int, namespace: str) -> Any:
    """The ``SimulatedCluster`` the restore benchmarks kill nodes of: ``workers`` one-CPU
    workers, fast failure detection, a store budget of one ``size``-byte state per node; every
    worker's object store fits a rank's RS(4,2) shards in flight (1.5x the size), or 4 fetched
    shards plus a raw object (2x)."""
    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.tools import quiet

    sim = SimulatedCluster(
        workers,
        namespace=namespace,
        store_budget_bytes=size + 16 * MIB,
        head_object_store_bytes=size // 2 + 128 * MIB,
        worker_object_store_bytes=2 * size + 128 * MIB,
    )
    quiet.quiet_driver()  # Ray's messages about the nodes killed stay in its logs
    return sim


def kill(sim: Any, node_ids: list[str]) -> float:
    """``SimulatedCluster.kill``: hard-kill the nodes, seconds until Ray declared them dead; a
    node never declared dead voids the run (BenchError)."""
    try:
        return float(sim.kill(node_ids))
    except TimeoutError as error:
        raise BenchError(str(error)) from None


def render_table(lines: list[tuple[str, ...]], *, left_columns: int = 0) -> str:
    """Columns two spaces apart, right-aligned but the first ``left_columns`` (left-aligned);
    the first line is the header, underlined."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = []
    for n, line in enumerate(lines):
        cells = [
            c.ljust(w) if i < left_columns else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        text.append("  ".join(cells))
        if n == 0:
            text.append("  ".join("-" * w for w in widths))
    return "\n".join(text)


def render_rows(header: tuple[str, ...], rows: Iterable[T], cells: Callable[[T], tuple[str, ...]]) -> str:
    """``rows`` as a table (``render_table``): ``header``, then ``cells(row)`` for each row."""
    return render_table([header, *(cells(row) for row in rows)])


def int_list(text: str, what: str, minimum: int) -> list[int]:
    """A comma-separated list of ints, each >= ``minimum`` (argparse.ArgumentTypeError naming
    ``what`` otherwise): the parsing of an argparse type."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of {what}: {text!r}") from None
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(f"{what} must be >= {minimum}")
    return values


def sizes_mib(text: str) -> list[int]:
    """argparse type: a comma-separated list of sizes in MiB, each >= 1."""
    return int_list(text, "MiB counts", 1)


def transfer_actors() -> tuple[Any, Any]:
    """(Holder, Receiver): the actors that measure raw Ray transfers. A Holder keeps arrays in
    its memory, as a store keeps shards (or puts them in its object store); a Receiver on
    another node fetches them and times ``ray.get`` (seconds, bytes)."""
    import numpy as np
    import ray

    @ray.remote(num_cpus=0, max_restarts=0)
    class Holder:
        def __init__(self) -> None:
            self.arrays: dict[int, Any] = {}

        def make(self, size: int, seed: int) -> None:
            from ray_ckpt.core import hostmem

            array = hostmem.allocate(size)
            array[:] = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
            self.arrays[seed] = array

        def get(self, seed: int) -> Any:
            return self.arrays.pop(seed)

        def put(self, seed: int) -> list[Any]:
            return [ray.put(self.arrays.pop(seed))]  # in a list: the caller gets the reference

    @ray.remote(num_cpus=0, max_restarts=0)
    class Receiver:
        def fetch(self, holder: Any, seed: int) -> tuple[float, int]:
            """An array a holder keeps in memory, through a method call."""
            started = time.perf_counter()
            array = ray.get(holder.get.remote(seed))
            return time.perf_counter() - started, int(array.nbytes)

        def fetch_all(self, holders: list[Any], seed: int) -> tuple[float, int]:
            """One array from each holder, all at once."""
            started = time.perf_counter()
            arrays = ray.get([holder.get.remote(seed) for holder in holders])
            return time.perf_counter() - started, sum(int(a.nbytes) for a in arrays)

        def pull(self, refs: list[Any]) -> tuple[float, int]:
            """An object already in a holder's object store."""
            started = time.perf_counter()
            array = ray.get(refs[0])
            return time.perf_counter() - started, int(array.nbytes)

    return Holder, Receiver
