"""Each parity kernel against raw ISA-L's own code for the same instruction set, in one run.

ISA-L picks its fastest code for the CPU it runs on (AVX-512 and GFNI where present), so
comparing it with the kernel ray_ckpt picks says nothing about a CPU with fewer extensions. Its
library also exports each variant by name; this script times ray_ckpt's ``_gf256.dot`` with
``_gf256.use(kernel)`` against the ISA-L function of the same instruction set, on the same
shards, one thread, alternating the two calls so both see the same load:

====================  ============================
ray_ckpt kernel       ISA-L function
====================  ============================
``avx2``              ``ec_encode_data_avx2``
``gfni-avx2``         ``ec_encode_data_avx2_gfni``
``gfni-avx512``       ``ec_encode_data_avx512_gfni``
====================  ============================

(the pairs this CPU runs). The ``avx2`` row is what an AVX2-only CPU gets from each. Per pair,
code RS(k, m) (Cauchy, as ISA-L's ``gf_gen_cauchy1_matrix`` makes it) and payload size: the best
of ``--repeats`` encodes of each, in GB/s of payload, and ours / ISA-L's. Every parity is
compared with ISA-L's; a mismatch aborts the run. ISA-L is the copy the pyeclib wheel bundles
(a test dependency).

    python scripts/bench_kernels.py [--codes 4,2 8,2] [--sizes-mib 1,64] [--repeats 15] [--json PATH]
"""

from __future__ import annotations

import ctypes
import glob
import os
import time
from typing import Any

import numpy as np
from benchutil import BenchError, add_json_flag, make_parser, render_table, sizes_mib, write_json

from ray_ckpt.core import _gf256

PAIRS = (
    ("avx2", "ec_encode_data_avx2"),
    ("gfni-avx2", "ec_encode_data_avx2_gfni"),
    ("gfni-avx512", "ec_encode_data_avx512_gfni"),
)


def load_isal() -> ctypes.CDLL:
    try:
        import pyeclib
    except ImportError as error:
        raise BenchError("needs pyeclib (a test dependency: pip install -e '.[test]')") from error
    found = glob.glob(os.path.join(os.path.dirname(os.path.dirname(pyeclib.__file__)), "pyeclib.libs", "libisal*"))
    if not found:
        raise BenchError("this pyeclib build bundles no ISA-L library")
    return ctypes.CDLL(found[0])


def measure(isal: ctypes.CDLL, k: int, m: int, size: int, repeats: int) -> list[dict[str, Any]]:
    shard = size // k
    matrix = np.zeros((k + m, k), dtype=np.uint8)
    isal.gf_gen_cauchy1_matrix(matrix.ctypes.data_as(ctypes.c_void_p), k + m, k)
    tables = {}
    for kind, init in (("shuffle", isal.ec_init_tables_base), ("gfni", isal.ec_init_tables_gfni)):
        tables[kind] = np.zeros(32 * k * m, dtype=np.uint8)  # ISA-L's two table layouts
        init(k, m, matrix[k:].ctypes.data_as(ctypes.c_void_p), tables[kind].ctypes.data_as(ctypes.c_void_p))
    data = np.random.default_rng(0).integers(0, 256, size=(k, shard), dtype=np.uint8)
    theirs, ours = np.zeros((m, shard), dtype=np.uint8), np.zeros((m, shard), dtype=np.uint8)
    data_ptrs = (ctypes.c_void_p * k)(*[row.ctypes.data for row in data])
    parity_ptrs = (ctypes.c_void_p * m)(*[row.ctypes.data for row in theirs])
    coefficients = matrix[k:].tobytes()
    best, rows = _gf256.isa(), []
    try:
        for kernel, function in PAIRS:
            if kernel not in _gf256.kernels():
                continue
            _gf256.use(kernel)
            encode = getattr(isal, function)
            table = tables["gfni" if "gfni" in kernel else "shuffle"].ctypes.data_as(ctypes.c_void_p)
            ours_s, theirs_s = [], []
            for _ in range(repeats + 1):  # the first of each is a warm-up
                start = time.perf_counter()
                encode(shard, k, m, table, data_ptrs, parity_ptrs)
                theirs_s.append(time.perf_counter() - start)
                start = time.perf_counter()
                _gf256.dot(coefficients, m, k, list(data), list(ours), 0, shard)
                ours_s.append(time.perf_counter() - start)
            if not np.array_equal(ours, theirs):
                raise BenchError(f"kernel {kernel}: RS({k},{m}) parity differs from ISA-L's {function}")
            gb = shard * k / 1e9
            rows.append(
                {
                    "kernel": kernel, "isal_function": function, "k": k, "m": m, "size_bytes": shard * k,
                    "ours_gbps": gb / min(ours_s[1:]), "isal_gbps": gb / min(theirs_s[1:]),
                    "ratio": min(theirs_s[1:]) / min(ours_s[1:]),
                }
            )  # fmt: skip
    finally:
        _gf256.use(best)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__)
    parser.add_argument("--codes", nargs="+", default=["4,2", "8,2"], help="k,m pairs (default 4,2 8,2)")
    parser.add_argument("--sizes-mib", type=sizes_mib, default=[1, 64], help="payload sizes (default 1,64)")
    parser.add_argument("--repeats", type=int, default=15, help="timed encodes of each, best taken (default 15)")
    add_json_flag(parser, "the rows")
    args = parser.parse_args(argv)
    codes = []
    for text in args.codes:
        try:
            k, m = (int(v) for v in text.split(","))
        except ValueError:
            parser.error(f"--codes takes k,m pairs such as 4,2; got {text!r}")
        if not (1 <= k <= 32 and 1 <= m <= 32):
            parser.error(f"k and m must be in 1..32; got {text!r}")
        codes.append((k, m))
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    isal = load_isal()
    rows = [row for k, m in codes for size in args.sizes_mib for row in measure(isal, k, m, size << 20, args.repeats)]
    lines = [("kernel", "RS", "MiB", "ours GB/s", "ISA-L GB/s", "ours / ISA-L")]
    for r in rows:
        lines.append(
            (
                r["kernel"], f"({r['k']},{r['m']})", f"{r['size_bytes'] / (1 << 20):.0f}",
                f"{r['ours_gbps']:.2f}", f"{r['isal_gbps']:.2f}", f"{r['ratio']:.2f}",
            )
        )  # fmt: skip
    print(render_table(lines))
    pairs = ", ".join(f"{kernel} = {function}" for kernel, function in PAIRS)
    print(f"\none thread, best of {args.repeats}; the ISA-L function of each kernel: {pairs}")
    write_json(args.json, {"benchmark": "kernels", "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
