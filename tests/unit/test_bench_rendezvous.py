"""scripts/bench_rendezvous.py without a cluster: who calls together on each path, the table's
ratio line, and its command line's checks (the cluster run itself is the benchmark's)."""

from __future__ import annotations

import pytest
from support.scripts_under_test import load_script

bench = load_script("bench_rendezvous", module_name="bench_rendezvous_under_test")


def test_the_relay_path_splits_the_members_over_the_real_stores_free_places_in_the_tree() -> None:
    stores = ["root", "s1", "s2"]
    slots = bench.relay_slots(stores, 16)  # type: ignore[attr-defined]
    assert len(slots) == 14 + 16 + 16 and slots[:3] == stores  # the root keeps 2 places for the other stores
    path = bench.Path("relay", "coordinator", stores, 16)  # type: ignore[attr-defined]
    members = list(range(8192))
    groups = path.groups(members)
    assert len(groups) == 46 and sorted(m for g in groups for m in g) == members
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert path.groups(members[:10]) == [[m] for m in range(10)]  # fewer members than places


def test_the_direct_path_is_one_call_per_member() -> None:
    path = bench.Path("direct", "coordinator", [], 16)  # type: ignore[attr-defined]
    assert path.groups([1, 2, 3]) == [[1], [2], [3]]


def test_the_table_gives_each_paths_rendezvous_at_the_largest_n_over_the_smallest() -> None:
    cpu = {"register": 1e-5, "rendezvous": 2e-5, "beat": 1e-5}
    rows = [
        {"members": n, "path": "relay", "callers": 46, "register_s": 0.1, "rendezvous_s": s, "beat_round_s": 0.1}
        for n, s in ((256, 0.2), (8192, 0.3))
    ]
    table = bench.format_table([dict(r, coordinator_cpu_s_per_member=cpu) for r in rows])  # type: ignore[attr-defined]
    assert "relay: rendezvous of 8192 members / 256 = 1.50x (0.300 s / 0.200 s)" in table
    assert "rendezvous 20.0 us" in table


@pytest.mark.parametrize(
    "argv, message",
    [(["--members", "256,x"], "comma-separated integers"), (["--paths", "tree"], "--paths takes relay and direct")],
)
def test_bad_options_are_refused_before_any_cluster_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench.main(argv)  # type: ignore[attr-defined]
    assert message in capsys.readouterr().err
