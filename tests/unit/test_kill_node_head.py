"""``ray-ckpt kill-node --allow-head``: its help says the head takes the ray_ckpt registry with it
(pinned there, it cannot restart elsewhere), and the kill is asked for first: only "y" or
"yes" at a terminal, or ``--yes``, goes on; without a terminal to ask on it is refused. No Ray:
the node lookups and the kill itself are stand-ins."""

from __future__ import annotations

import io
from typing import Any

import pytest

from ray_ckpt.errors import CliError
from ray_ckpt.tools import cli, faults

HEAD = "h" * 56
OTHER = "o" * 56


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The victims each kill was fired at (nothing is fired at a real cluster)."""
    fired: list[list[str]] = []

    def inject(fault: Any, victims: list[str], **kwargs: Any) -> list[Any]:
        fired.append(victims)
        return []

    monkeypatch.setattr(cli.naming, "head_node_id", lambda: HEAD)
    monkeypatch.setattr(cli, "resolve_node", lambda text: text)
    monkeypatch.setattr(faults._NodeDeath, "check", lambda self, node_ids, **kwargs: None)
    monkeypatch.setattr(cli.chaos, "inject", inject)
    return fired


def kill_node(*options: str) -> int:
    args = cli.build_parser().parse_args(["kill-node", *options, "--json"])
    return int(args.handler(args))


def test_the_help_says_the_registry_goes_with_the_head(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["kill-node", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "also kills the ray_ckpt registry" in text and "cannot restart elsewhere" in text and "--yes" in text


def test_without_a_terminal_the_head_is_not_killed_unless_yes(
    kills: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("yes\n"))  # piped: not a confirmation
    with pytest.raises(CliError, match=r"ray_ckpt registry.*refusing without --yes \(stdin is not a terminal"):
        kill_node("--node", HEAD, "--allow-head")
    assert kills == []
    assert kill_node("--node", HEAD, "--allow-head", "--yes") == 0
    assert kills == [[HEAD]]


@pytest.mark.parametrize(
    ("answer", "killed"), [("y\n", True), ("YES\n", True), ("n\n", False), ("\n", False), ("", False)]
)
def test_at_a_terminal_only_yes_kills_the_head(
    kills: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    answer: str,
    killed: bool,
) -> None:
    monkeypatch.setattr("sys.stdin", Terminal(answer))
    if killed:
        assert kill_node("--node", HEAD, "--node", OTHER, "--allow-head") == 0
        assert kills == [[HEAD, OTHER]]
    else:
        with pytest.raises(CliError, match="not killed"):
            kill_node("--node", HEAD, "--node", OTHER, "--allow-head")
        assert kills == []
    assert "cannot restart elsewhere" in capsys.readouterr().out  # the question said why


def test_other_nodes_are_not_asked_about_and_yes_goes_with_allow_head(
    kills: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert kill_node("--node", OTHER, "--allow-head") == 0
    assert kills == [[OTHER]]
    with pytest.raises(CliError, match="--yes goes with --allow-head"):
        kill_node("--node", OTHER, "--yes")
