"""``ray-ckpt dashboard``'s banner names an address the operator can open: the host it listens
on, or for all interfaces (``--host 0.0.0.0``) this machine's address, never 127.0.0.1 alone."""

from __future__ import annotations

import argparse
import pathlib

import pytest

from ray_ckpt.dashboard import server


class FakeServer:
    server_port = 8266

    def serve_forever(self) -> None:
        raise KeyboardInterrupt  # the operator's Ctrl-C, at once

    def server_close(self) -> None:
        pass


def banner(
    host: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    events = tmp_path / "events.jsonl"
    events.write_text("")
    monkeypatch.setattr(server, "make_server", lambda dashboard, host, port, allowed_hosts: FakeServer())
    args = argparse.Namespace(
        events=[str(events)], address=None, namespace=None, export=None, host=host, port=0, allow_host=[]
    )
    assert server.run(args, connect=lambda: False) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("host", ["0.0.0.0", ""])
def test_all_interfaces_print_this_hosts_address(
    host: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(server, "host_address", lambda: "10.1.2.3", raising=False)
    out = banner(host, tmp_path, monkeypatch, capsys)
    assert "http://10.1.2.3:8266/" in out and "all interfaces" in out


def test_all_interfaces_without_a_known_address_say_so(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(server, "host_address", lambda: None, raising=False)
    out = banner("0.0.0.0", tmp_path, monkeypatch, capsys)
    assert "all interfaces" in out and "port 8266" in out


def test_one_interface_prints_that_address(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = banner("192.168.7.9", tmp_path, monkeypatch, capsys)
    assert "http://192.168.7.9:8266/" in out and "all interfaces" not in out


def test_this_hosts_address_is_an_address_or_none() -> None:
    """Found without sending anything; on a machine without a network, None."""
    address = server.host_address()
    assert address is None or (address.count(".") == 3 and not address.startswith("127."))
