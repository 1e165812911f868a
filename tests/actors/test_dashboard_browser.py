"""The built-in dashboard in a real browser: `ray-ckpt dashboard --events FILE` (no cluster) on a
free port, rendered by headless Chromium. Checks the rendered DOM (one recovery bar per recorded
failure, with the recorded phase values), that the page logged no error, and saves a screenshot
under artifacts/ to look at."""

from __future__ import annotations

import os
import pathlib
import queue
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
import recorded_events

from ray_ckpt import timeline

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"


def _install_chromium() -> str | None:
    """Debian's chromium, installed with apt-get if missing; None (with the reason printed) if impossible."""
    found = shutil.which("chromium")
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        try:
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=900)
        except (subprocess.SubprocessError, OSError) as error:
            print(f"could not install chromium ({' '.join(command)}): {error}", file=sys.stderr)
            return None
    return shutil.which("chromium")


@pytest.fixture(scope="module")
def chromium() -> str:
    path = _install_chromium()
    if path is None:
        pytest.skip("headless Chromium is unavailable and `apt-get install -y chromium` was impossible here")
    return path


@pytest.fixture
def dashboard_url(tmp_path: pathlib.Path) -> Iterator[str]:
    """`ray-ckpt dashboard --events <recorded file> --port 0` in a subprocess; yields its URL."""
    events_file = recorded_events.write(tmp_path / "events-ray_ckpt.jsonl")
    process = subprocess.Popen(
        [sys.executable, "-m", "ray_ckpt.cli", "dashboard", "--events", str(events_file), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    try:
        seen = []
        while True:
            try:
                line = lines.get(timeout=60)
            except queue.Empty:
                pytest.fail(f"the dashboard did not start within 60 s; output: {''.join(seen)}")
            seen.append(line)
            if "http://" in line:
                yield line[line.index("http://") :].split()[0]
                break
            if process.poll() is not None and lines.empty():
                pytest.fail(f"the dashboard exited with {process.returncode}: {''.join(seen)}")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _run_chromium(chromium: str, profile: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--hide-scrollbars",
            "--virtual-time-budget=10000",  # let the page fetch /api/data and render
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


class _Page(HTMLParser):
    """Collects the recovery bars (``<g class="recovery">`` and their phase rects), the text of
    ``#errors`` and the body's attributes from a dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.recoveries: list[dict[str, Any]] = []
        self.errors = ""
        self.body: dict[str, str | None] = {}
        self._in_recovery = 0  # nesting depth of <g> inside the current recovery group
        self._in_errors = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        classes = (found.get("class") or "").split()
        if tag == "body":
            self.body = found
        if tag == "div" and found.get("id") == "errors":
            self._in_errors = 1
        elif self._in_errors and tag == "div":
            self._in_errors += 1
        if tag == "g":
            if self._in_recovery:
                self._in_recovery += 1
            elif "recovery" in classes:
                self._in_recovery = 1
                self.recoveries.append({"attrs": found, "phases": {}})
        if tag == "rect" and self._in_recovery and "phase" in classes:
            self.recoveries[-1]["phases"][found["data-phase"]] = float(found["data-seconds"] or "nan")

    def handle_endtag(self, tag: str) -> None:
        if tag == "g" and self._in_recovery:
            self._in_recovery -= 1
        if tag == "div" and self._in_errors:
            self._in_errors -= 1

    def handle_data(self, data: str) -> None:
        if self._in_errors:
            self.errors += data


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _check_page(dom: str, stderr: str) -> _Page:
    page = _Page()
    page.feed(dom)
    assert page.body.get("data-rendered"), "the page never rendered its data"
    assert page.errors.strip() == "", f"the page reported errors: {page.errors}"
    assert _console_lines(stderr) == [], "the page wrote to the console"
    assert len(page.recoveries) == len(recorded_events.EXPECTED), "one recovery bar per recorded failure"
    for bar, want in zip(page.recoveries, recorded_events.EXPECTED):
        assert bar["attrs"]["data-job"] == recorded_events.JOB
        assert bar["attrs"]["data-attempt"] == want["attempt"]
        assert float(bar["attrs"]["data-time-to-resume"]) == pytest.approx(want["time_to_resume_s"], abs=1e-6)
        assert bar["attrs"]["data-killed-nodes"].split(",") == want["killed_nodes"]
        measured = {p: v for p, v in bar["phases"].items() if p in timeline.PHASES}
        assert set(measured) == set(timeline.PHASES)
        for phase, seconds in want["phases_s"].items():
            assert measured[phase] == pytest.approx(seconds, abs=1e-6), phase
    for text in ("no data (live cluster needed)", "Save stall", "Time to resume"):
        assert text in dom
    return page


def test_dashboard_renders_recorded_recoveries(chromium: str, dashboard_url: str, tmp_path: pathlib.Path) -> None:
    dumped = _run_chromium(chromium, tmp_path / "profile-dom", "--dump-dom", dashboard_url)
    assert dumped.returncode == 0, dumped.stderr[-3000:]
    _check_page(dumped.stdout, dumped.stderr)

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "dashboard.png"
    screenshot.unlink(missing_ok=True)
    shot = _run_chromium(
        chromium, tmp_path / "profile-shot", f"--screenshot={screenshot}", "--window-size=1400,1800", dashboard_url
    )
    assert shot.returncode == 0, shot.stderr[-3000:]
    assert _console_lines(shot.stderr) == []
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 20_000  # a drawn page, not a blank one


def test_exported_report_renders_without_a_server(chromium: str, tmp_path: pathlib.Path) -> None:
    events_file = recorded_events.write(tmp_path / "events.jsonl")
    report = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "ray_ckpt.cli", "dashboard", "--events", str(events_file), "--export", str(report)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 recoveries" in done.stdout
    dumped = _run_chromium(chromium, tmp_path / "profile", "--dump-dom", report.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-3000:]
    _check_page(dumped.stdout, dumped.stderr)
