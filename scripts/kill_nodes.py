"""Simulate node failures on a running Ray cluster: the same as ``ray-ckpt kill-node``.

    python scripts/kill_nodes.py --random --count 2 --address HEAD_IP:6379
    python scripts/kill_nodes.py --mtbf 120 --kills 5 --seed 1
    python scripts/kill_nodes.py --during-save my-job
    python scripts/kill_nodes.py --help

See docs/failure-simulation.md.
"""

from __future__ import annotations

import sys

from ray_ckpt.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["kill-node", *sys.argv[1:]]))
