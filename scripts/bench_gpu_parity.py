"""GPU parity against the save path's CPU parity: is computing parity on the GPU worth it?

For a payload of each size already on the GPU, RS(k, m), per row:

- ``d2h_s``: the device->host copy of the payload into pinned memory (what every save pays,
  and the only GPU work in its blocking part);
- ``gpu_parity_s``: ``codec_torch.encode_parity`` on the GPU (the extra m/k parity bytes would
  then be copied to the host as well, and a contiguous device copy of the payload is needed);
- ``cpu_parity_s``: ``codec.ReedSolomon.encode_parity`` on the host copy (what the save path's
  background thread does, off the training loop).

Needs a CUDA device.

    python scripts/bench_gpu_parity.py [--sizes-mib 64,256,1024] [--code 4,2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def timed(run: Callable[[], None], repeats: int, sync: Callable[[], None]) -> float:
    """Median seconds of ``run`` over ``repeats`` runs after one warm-up."""
    run()
    sync()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        sync()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def measure(code: Any, mib: int, repeats: int) -> dict[str, Any]:
    """One row: the three timings for a ``mib`` MiB payload; ValueError if GPU and CPU parity differ."""
    import numpy as np
    import torch

    from ray_ckpt.core import codec_torch

    k, m = code.data_shards, code.parity_shards
    length = (mib << 20) // k
    data = torch.randint(0, 256, (k, length), dtype=torch.uint8, device="cuda")
    parity = torch.empty((m, length), dtype=torch.uint8, device="cuda")
    host = torch.empty((k, length), dtype=torch.uint8, pin_memory=True)
    host_parity = [np.empty(length, dtype=np.uint8) for _ in range(m)]
    d2h = timed(lambda: host.copy_(data, non_blocking=True), repeats, torch.cuda.synchronize)
    gpu = timed(lambda: codec_torch.encode_parity(code, data, parity), repeats, torch.cuda.synchronize)
    shards = list(host.numpy())
    cpu = timed(lambda: code.encode_parity(shards, host_parity), repeats, lambda: None)
    if not all(np.array_equal(parity[i].cpu().numpy(), host_parity[i]) for i in range(m)):
        raise ValueError("GPU and CPU parity differ")
    return {"size_mib": mib, "k": k, "m": m, "d2h_s": d2h, "gpu_parity_s": gpu, "cpu_parity_s": cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", default="64,256,1024", help="payload sizes in MiB, comma-separated")
    parser.add_argument("--code", default="4,2", help="k,m (default 4,2)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=pathlib.Path, metavar="PATH")
    args = parser.parse_args(argv)

    import torch

    from ray_ckpt.core.codec import ReedSolomon

    if not torch.cuda.is_available():
        print("bench_gpu_parity: needs a CUDA device", file=sys.stderr)
        return 2
    k, m = (int(x) for x in args.code.split(","))
    code = ReedSolomon(k, m)
    rows = []
    print(f"{'MiB':>6} {'d2h s':>8} {'gpu parity s':>13} {'cpu parity s':>13} {'gpu/d2h':>8} {'cpu/gpu':>8}")
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        row = measure(code, mib, args.repeats)
        rows.append(row)
        d2h, gpu, cpu = row["d2h_s"], row["gpu_parity_s"], row["cpu_parity_s"]
        print(f"{mib:>6} {d2h:>8.4f} {gpu:>13.4f} {cpu:>13.4f} {gpu / d2h:>8.2f} {cpu / gpu:>8.1f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
