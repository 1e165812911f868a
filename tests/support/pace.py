"""How fast this machine runs the suite: the unit of every test bound that depends on its speed.

A cluster test waits for things whose time scales with the machine (a Python process importing
Ray and torch, a training step, a Ray node starting). Its bounds are written in seconds on the
development machine and multiplied by ``pace()``: this run's time for a fixed probe (a fresh
interpreter importing ray and torch, and a fixed CPU loop) over the same probe's time on the
development machine, never below 1. ``RAY_CKPT_TEST_PACE`` sets the pace instead of measuring it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

# The probes' best times on the development machine (2 cores, idle), in seconds.
REFERENCE_IMPORT_S = 2.3
REFERENCE_CPU_S = 0.10

_pace: float | None = None


def _import_s() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import ray, torch"], check=True, capture_output=True)
    return time.perf_counter() - started


_CPU_PROBE = """
import time
def loop():
    total = 0
    for i in range(2_000_000):
        total += i * i % 7
    return total
started = time.perf_counter()
loop()
print(time.perf_counter() - started)
"""


def _cpu_s() -> float:
    """A fixed loop in a fresh interpreter (the suite's own process carries Ray's and torch's
    threads and heaps, which slow it apart from the machine)."""
    done = subprocess.run([sys.executable, "-c", _CPU_PROBE], check=True, capture_output=True, text=True)
    return float(done.stdout)


def measure() -> tuple[float, float]:
    """The probes' best of three and of five, in seconds: (import, cpu)."""
    return min(_import_s() for _ in range(3)), min(_cpu_s() for _ in range(5))


def pace() -> float:
    """This machine's slowness against the development machine, measured once per run (>= 1)."""
    global _pace
    if _pace is None:
        override = os.environ.get("RAY_CKPT_TEST_PACE")
        if override:
            _pace = float(override)
            if not _pace >= 1.0:
                raise ValueError(f"RAY_CKPT_TEST_PACE={override!r}: give a number of at least 1")
        else:
            import_s, cpu_s = measure()
            _pace = max(1.0, import_s / REFERENCE_IMPORT_S, cpu_s / REFERENCE_CPU_S)
    return _pace


def measured() -> float | None:
    """The pace if this run has needed it, else None."""
    return _pace


def bound(seconds: float) -> float:
    """A bound of ``seconds`` on the development machine, stretched to this machine's pace."""
    return seconds * pace()
