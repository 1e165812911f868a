"""Start a network lab: a Ray cluster whose worker nodes are hosts of their own on one machine.

Each worker node runs in its own Linux network namespace with its own address on a bridge,
optionally at a shaped rate, so a node can fail as a machine does without closing a socket
(``ray-ckpt kill-node --fault power|partition|slow|flap``). Needs root; see
docs/failure-simulation.md.

    sudo python scripts/lab.py --nodes 4 --rate-gbit 2.5     # prints the address, runs until Ctrl-C
    RAY_ADDRESS=<printed address> python my_job.py          # a driver joins it
    python scripts/lab.py --clean                           # take down labs left by a crash
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading

from ray_ckpt.tools import network_lab


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4, help="worker nodes, each its own host (default 4)")
    parser.add_argument("--cpus", type=int, default=1, help="CPUs each worker node offers Ray (default 1)")
    parser.add_argument("--rate-gbit", type=float, help="each node's link rate in Gbit/s, both ways (default unshaped)")
    parser.add_argument(
        "--object-store-mib", type=int, default=256, help="each node's object store in MiB (default 256)"
    )
    parser.add_argument("--no-service", action="store_true", help="do not start the ray_ckpt service in the lab")
    parser.add_argument("--clean", action="store_true", help="take down labs whose owner is gone, then exit")
    args = parser.parse_args(argv)
    if args.clean:
        removed = network_lab.clean_stale()
        print(f"removed: {', '.join(removed) if removed else 'nothing'}")
        return 0
    reason = network_lab.lab_unsupported()
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    done = threading.Event()
    lab = network_lab.NetworkLab(
        args.nodes, cpus=args.cpus, rate_gbit=args.rate_gbit, object_store_bytes=args.object_store_mib << 20
    )
    try:
        address = lab.start(connect=not args.no_service)
        if not args.no_service:
            import ray

            import ray_ckpt

            ray_ckpt.start()
            ray.shutdown()
        rate = f"{args.rate_gbit:g} Gbit/s" if args.rate_gbit else "unshaped"
        print(f"lab up: head {address} (bridge {lab.state.bridge}), links {rate}")
        for node in lab.nodes:
            print(f"  node {node.index}: {node.address} (namespace {node.namespace}, resource {node.resource})")
        print(f"join it: RAY_ADDRESS={address} RAY_AUTH_MODE=disabled; Ctrl-C takes it down", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: done.set())  # after Ray's driver set its own
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    finally:
        lab.close()
        print("lab down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
