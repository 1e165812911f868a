"""Codec throughput: ray_ckpt's Reed-Solomon encode/decode against memcpy, zfec and pyeclib (ISA-L).

What is measured, for RS(4,1), RS(4,2), RS(8,2) and RS(6,3) on one random payload (default
64 MiB), as the median of ``--repeats`` timed runs after one warm-up run, in GB/s (1e9 bytes/s)
of *payload* bytes:

- ``ray_ckpt`` encode: ``code.encode_parity(data_shards, out=parity)`` -- the hot path: the data
  shards are views of the payload (only a zero-padded tail shard is a copy, made once) and the
  parity goes into reused buffers. Decode: ``code.decode_into(shards, out=buffer)`` in the worst
  case, with the m lost shards being data shards 0..m-1 so all of them must be rebuilt from
  parity. One row with ``threads=1`` and one with ``--threads`` (default: all cores); threaded
  rows use the threads whatever the payload size (the library's small-payload threshold is off).
- ``memcpy``: ``np.copyto`` of the payload into a preallocated buffer, the floor any codec pays to
  touch the data once. Reported once, as RS(1,0) (a copy is that code), with encode = decode.
- ``zfec``: ``zfec.Encoder(k, k+m).encode(blocks, parity numbers)`` on k prepared bytes blocks,
  and ``zfec.Decoder(k, k+m).decode`` of the same worst-case k blocks (output assembly untimed).
- ``pyeclib`` with ec_type ``isa_l_rs_vand``: ``ECDriver.encode(payload bytes)`` (which also
  splits and copies the payload into framed fragments) and ``ECDriver.decode`` of the fragments
  with data fragments 0..m-1 dropped. Skipped with a note when the library or driver is missing.

zfec and pyeclib run on one thread. Every decode result is compared with the payload and a
mismatch aborts the run. The table adds encode/memcpy and encode/zfec ratios; ``--json PATH``
writes the rows as a list of ``{"impl", "k", "m", "size_bytes", "encode_gbps", "decode_gbps",
"threads"}``.

To see how close the codec comes to the hardware's practical limit, run the repository's
sibling shared/tools/isal_ref.py reference (raw ISA-L ``ec_encode_data`` on one thread, with the
same ``--k``, ``--m`` and ``--size-mib``) next to this script and compare its encode GB/s with
the ``ray_ckpt`` threads=1 rows.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from benchutil import BenchError, add_json_flag, make_parser, render_table, write_json

from ray_ckpt import settings
from ray_ckpt.core import codec
from ray_ckpt.core.codec import ReedSolomon

CODES = [(4, 1), (4, 2), (8, 2), (6, 3)]
IMPLS = ("ray_ckpt", "memcpy", "zfec", "pyeclib")
PYECLIB_TYPE = "isa_l_rs_vand"


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: page faults, lazy tables, thread pool start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _gbps(size: int, seconds: float) -> float:
    return size / seconds / 1e9 if seconds > 0 else float("inf")


def _row(impl: str, k: int, m: int, size: int, encode: float, decode: float, threads: int) -> dict[str, Any]:
    return {
        "impl": impl,
        "k": k,
        "m": m,
        "size_bytes": size,
        "encode_gbps": round(encode, 4),
        "decode_gbps": round(decode, 4),
        "threads": threads,
    }


def _check(impl: str, k: int, m: int, got: Any, payload: np.ndarray) -> None:
    view = np.frombuffer(memoryview(got), dtype=np.uint8) if not isinstance(got, np.ndarray) else got
    if view.size < payload.size or not np.array_equal(view[: payload.size], payload):
        raise BenchError(f"{impl} RS({k},{m}) decoded a payload that differs from the one encoded")


def bench_memcpy(payload: np.ndarray, repeats: int) -> dict[str, Any]:
    target = np.empty_like(payload)
    rate = _gbps(payload.size, _median_seconds(lambda: np.copyto(target, payload), repeats))
    _check("memcpy", 1, 0, target, payload)
    return _row("memcpy", 1, 0, payload.size, rate, rate, 1)


def bench_ray_ckpt(payload: np.ndarray, k: int, m: int, threads: int, repeats: int) -> dict[str, Any]:
    code = ReedSolomon(k, m, threads=threads)
    data = code.split(payload)
    length = code.shard_size(payload.size)
    parity = [np.empty(length, dtype=np.uint8) for _ in range(m)]
    min_bytes = {"RAY_CKPT_CODEC_PARALLEL_MIN_BYTES": 0} if threads > 1 else {}
    with settings.override(**min_bytes):
        encode = _median_seconds(lambda: code.encode_parity(data, out=parity), repeats)
        shards = data + parity
        kept = {i: shards[i] for i in range(m, k + m)}
        out = np.empty(k * length, dtype=np.uint8)
        decode = _median_seconds(lambda: code.decode_into(kept, out=out), repeats)
    _check("ray_ckpt", k, m, out, payload)
    return _row("ray_ckpt", k, m, payload.size, _gbps(payload.size, encode), _gbps(payload.size, decode), threads)


def bench_zfec(zfec: Any, payload: np.ndarray, k: int, m: int, repeats: int) -> dict[str, Any]:
    code = ReedSolomon(k, m)  # only to split the payload the same way
    blocks = [bytes(shard) for shard in code.split(payload)]
    encoder = zfec.Encoder(k, k + m)
    wanted = list(range(k, k + m))
    encode = _median_seconds(lambda: encoder.encode(blocks, wanted), repeats)
    shards = blocks + list(encoder.encode(blocks, wanted))
    numbers = list(range(m, k + m))
    kept = [shards[i] for i in numbers]
    decoder = zfec.Decoder(k, k + m)
    decode = _median_seconds(lambda: decoder.decode(kept, numbers), repeats)
    _check("zfec", k, m, b"".join(bytes(b) for b in decoder.decode(kept, numbers)), payload)
    return _row("zfec", k, m, payload.size, _gbps(payload.size, encode), _gbps(payload.size, decode), 1)


def bench_pyeclib(driver_cls: Any, payload: np.ndarray, k: int, m: int, repeats: int) -> dict[str, Any]:
    driver = driver_cls(k=k, m=m, ec_type=PYECLIB_TYPE)
    raw = payload.tobytes()
    encode = _median_seconds(lambda: driver.encode(raw), repeats)
    fragments = driver.encode(raw)
    kept = fragments[m:]  # fragments 0..k-1 hold data, k.. parity: drop data 0..m-1
    decode = _median_seconds(lambda: driver.decode(kept), repeats)
    _check("pyeclib", k, m, driver.decode(kept), payload)
    return _row("pyeclib", k, m, payload.size, _gbps(payload.size, encode), _gbps(payload.size, decode), 1)


def _load_zfec(notes: list[str]) -> Any:
    try:
        import zfec
    except ImportError:
        notes.append("zfec: not installed, skipped (pip install zfec)")
        return None
    return zfec


def _load_pyeclib(notes: list[str]) -> Any:
    try:
        from pyeclib.ec_iface import ECDriver
    except ImportError:
        notes.append("pyeclib: not installed, skipped (pip install pyeclib)")
        return None
    try:
        ECDriver(k=2, m=1, ec_type=PYECLIB_TYPE)
    except Exception as exc:  # the driver raises its own error types when a backend is missing
        notes.append(f"pyeclib: ec_type {PYECLIB_TYPE} unavailable ({type(exc).__name__}: {exc}), skipped")
        return None
    return ECDriver


def run(size: int, repeats: int, threads: int, notes: list[str]) -> list[dict[str, Any]]:
    """All rows for a random payload of ``size`` bytes."""
    payload = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    zfec = _load_zfec(notes)
    ec_driver = _load_pyeclib(notes)
    rows = [bench_memcpy(payload, repeats)]
    for k, m in CODES:
        rows.append(bench_ray_ckpt(payload, k, m, 1, repeats))
        if threads > 1:
            rows.append(bench_ray_ckpt(payload, k, m, threads, repeats))
        if zfec is not None:
            rows.append(bench_zfec(zfec, payload, k, m, repeats))
        if ec_driver is not None:
            rows.append(bench_pyeclib(ec_driver, payload, k, m, repeats))
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as an aligned text table with encode/memcpy and encode/zfec ratios."""
    memcpy = next((r["encode_gbps"] for r in rows if r["impl"] == "memcpy"), None)
    zfec = {(r["k"], r["m"]): r["encode_gbps"] for r in rows if r["impl"] == "zfec"}
    header = ("impl", "k", "m", "threads", "encode GB/s", "decode GB/s", "enc/memcpy", "enc/zfec")
    lines = [header]
    for r in rows:
        enc = r["encode_gbps"]
        vs_memcpy = f"{enc / memcpy:.2f}" if memcpy else "-"
        base = zfec.get((r["k"], r["m"]))
        vs_zfec = f"{enc / base:.2f}" if base else "-"
        lines.append(
            (
                r["impl"],
                str(r["k"]),
                str(r["m"]),
                str(r["threads"]),
                f"{enc:.2f}",
                f"{r['decode_gbps']:.2f}",
                vs_memcpy,
                vs_zfec,
            )
        )
    return render_table(lines, left_columns=1)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, "See the module docstring for exactly what each row times.")
    parser.add_argument("--size-mib", type=int, default=64, help="payload size in MiB (default 64)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (default 7)")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="threads for the multi-threaded ray_ckpt rows (default: all cores)",
    )
    add_json_flag(parser)
    parser.add_argument("--quick", action="store_true", help="4 MiB payload, 3 repeats (for tests)")
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mib, args.repeats = 4, 3
    if args.size_mib < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--size-mib, --repeats and --threads must be >= 1")

    size = args.size_mib << 20
    notes: list[str] = []
    print(
        f"payload {args.size_mib} MiB, median of {args.repeats} after a warm-up, GB/s of payload; "
        f"ray_ckpt kernel: {codec.KERNEL}; cores: {os.cpu_count()}"
    )
    rows = run(size, args.repeats, args.threads, notes)
    print(format_table(rows))
    for note in notes:
        print(f"note: {note}")
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
