"""The built-in dashboard in a real browser: `ray-ckpt dashboard --events FILE` (no cluster) on a
free port, and its `--export` report, rendered by headless Chromium. Checks the rendered DOM (one
recovery bar per recorded failure with the recorded phase values, the failed one as a failure;
the zoomed restore phases; memory, protection and placement from the newest status snapshot;
hosts and ranks per node; single-point charts' axes), that the page logged no error, and saves
screenshots under artifacts/ to look at."""

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

import pytest
from support import pace, recorded_events

from ray_ckpt.core import timeline

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
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=pace.bound(900))
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
        [sys.executable, "-m", "ray_ckpt.tools.cli", "dashboard", "--events", str(events_file), "--port", "0"],
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
                line = lines.get(timeout=pace.bound(60))
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
        timeout=pace.bound(180),
    )


class _Element:
    """One element of a dumped DOM: tag, attributes, children and its own text."""

    def __init__(self, tag: str, attrs: dict[str, str | None], parent: _Element | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[_Element] = []
        self.own_text = ""

    @property
    def classes(self) -> list[str]:
        return (self.attrs.get("class") or "").split()

    def text(self) -> str:
        return self.own_text + "".join(child.text() for child in self.children)

    def walk(self) -> Iterator[_Element]:
        yield self
        for child in self.children:
            yield from child.walk()

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[_Element]:
        """Descendants (and self) with ``tag``, class ``cls`` and attribute values (``data_x`` for ``data-x``)."""
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            e
            for e in self.walk()
            if (tag is None or e.tag == tag)
            and (cls is None or cls in e.classes)
            and all(e.attrs.get(k) == v for k, v in wanted.items())
        ]

    def find(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> _Element:
        found = self.find_all(tag, cls, **attrs)
        assert found, f"no <{tag} class={cls} {attrs}> in the page"
        return found[0]


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Dom(HTMLParser):
    """A dumped DOM as an _Element tree (SVG elements included)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.root = _Element("#document", {}, None)
        self._at = self.root
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = _Element(tag, dict(attrs), self._at)
        self._at.children.append(element)
        if tag not in _VOID:
            self._at = element

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._at.children.append(_Element(tag, dict(attrs), self._at))

    def handle_endtag(self, tag: str) -> None:
        node: _Element | None = self._at
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self._at = node.parent

    def handle_data(self, data: str) -> None:
        self._at.own_text += data


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _check_page(dom: str, stderr: str) -> _Element:
    """The recorded events rendered: every recovery bar with its phases (failed ones as failures),
    the zoomed restore view, and memory, protection and placement from the newest status snapshot
    with hosts and ranks per node. Returns the page."""
    page = _Dom(dom).root
    assert page.find("body").attrs.get("data-rendered"), "the page never rendered its data"
    assert page.find("div", id="errors").text().strip() == "", "the page reported errors"
    assert _console_lines(stderr) == [], "the page wrote to the console"
    nodes, hosts, job = recorded_events.NODES, recorded_events.HOSTS, recorded_events.JOB

    # recoveries: one bar per failure, the failed one marked failed with its error
    bars = page.find("svg", id="recovery-bars").find_all("g", cls="recovery")
    assert len(bars) == len(recorded_events.EXPECTED_ALL), "one recovery bar per recorded failure"
    for bar, want in zip(bars, recorded_events.EXPECTED_ALL):
        assert bar.attrs["data-job"] == job
        assert bar.attrs["data-attempt"] == want["attempt"]
        assert bar.attrs["data-killed-nodes"].split(",") == want["killed_nodes"]
        measured = {
            r.attrs["data-phase"]: float(r.attrs["data-seconds"] or "nan") for r in bar.find_all("rect", "phase")
        }
        measured.pop("other", None)
        assert set(measured) == set(want["phases_s"])
        for phase, seconds in want["phases_s"].items():
            assert measured[phase] == pytest.approx(seconds, abs=1e-6), phase
        if want.get("failed"):
            assert bar.attrs["data-failed"] == "true" and "failed" in bar.classes
            assert bar.attrs["data-error"] == want["error"]
            assert "FAILED: ConfigError" in bar.text() and "data-time-to-resume" not in bar.attrs
        else:
            assert bar.attrs["data-failed"] == "false"
            assert float(bar.attrs["data-time-to-resume"]) == pytest.approx(want["time_to_resume_s"], abs=1e-6)
    cards = {c.find(cls="label").text(): c.find(cls="value") for c in page.find_all("div", cls="card")}
    assert cards["Recoveries"].text() == "2"  # resumed ones only
    assert cards["Failed recoveries"].text() == "1" and "bad" in cards["Failed recoveries"].classes
    assert f"Time to resume, {job}" in cards and "Median time to resume" not in cards  # per job, never pooled
    subs = {c.find(cls="label").text(): c.find(cls="sub").text() for c in page.find_all("div", cls="card")}
    assert subs[f"Time to resume, {job}"] == "median over 2 recoveries"
    outcomes = [row.find("td", cls="outcome").text() for row in page.find_all("tr", cls="recovery-row")]
    assert outcomes[:2] == ["resumed", "resumed"] and outcomes[2].startswith("failed: ConfigError")

    # the restore, zoomed in: each restore phase many times wider than in the whole-recovery bar
    zoom = page.find("svg", id="restore-bars").find_all("g", cls="restore")
    assert len(zoom) == len(bars)
    for bar, zoomed, want in zip(bars, zoom, recorded_events.EXPECTED_ALL):
        if want.get("failed"):
            assert zoomed.attrs["data-failed"] == "true" and "restore failed" in zoomed.text()
            assert zoomed.find_all("rect", "phase") == []
            continue
        for phase in timeline.RESTORE_PHASES:
            whole = float(bar.find("rect", "phase", data_phase=phase).attrs["width"] or "0")
            near = float(zoomed.find("rect", "phase", data_phase=phase).attrs["width"] or "0")
            assert near >= 5 * whole, phase
        fetch = zoomed.find("rect", "phase", data_phase="fetch")
        assert float(fetch.attrs["data-seconds"] or "0") == pytest.approx(want["phases_s"]["fetch"], abs=1e-6)

    # memory, protection and placement from the newest status snapshot (no cluster here)
    memory = {row.attrs["data-node"]: row for row in page.find_all("div", cls="memory-row")}
    assert set(memory) == {nodes[i] for i in recorded_events.SURVIVORS}
    assert "status snapshot" in page.find("section", id="panel-memory").find(cls="source-note").text()
    for i in recorded_events.SURVIVORS:  # hosts, and the ranks running on each node
        assert memory[nodes[i]].attrs["data-host"] == hosts[i]
        assert memory[nodes[i]].find(cls="host").text().startswith(hosts[i])
    ranks_on = {0: "gpt-small r0", 1: "gpt-small r1", 7: "gpt-small r2", 3: "gpt-small r3"}
    for i, text in ranks_on.items():
        assert memory[nodes[i]].attrs["data-ranks"] == text and text in memory[nodes[i]].text()
    assert "225.0 MiB / 256.0 MiB" in memory[nodes[1]].text()
    assert "killed after the snapshot" in memory[nodes[3]].text()
    assert "dead" in memory[nodes[2]].classes
    card = page.find("div", cls="protection-card", data_job=job)
    assert card.attrs["data-protection"] == "-1" and card.attrs["data-source"] == "snapshot"
    assert "then 1" in card.text()  # what the snapshot recorded, before nodes 2 and 3 went
    table = page.find("section", id="panel-placement").find("table", data_job=job)
    assert "step 60" in table.find("caption").text()
    heads = {th.attrs["data-node"]: th for th in table.find_all("th", cls="node-head")}
    assert {n: th.attrs["data-host"] for n, th in heads.items()} == {n: hosts[nodes.index(n)] for n in heads}
    assert "runs r2" in heads[nodes[7]].text()
    lost = {
        (int(td.attrs["data-rank"] or "-1"), td.attrs["data-node"]) for td in table.find_all("td", data_lost="true")
    }
    assert lost == {(r, nodes[n]) for r, by_node in recorded_events.LOST_AFTER_SNAPSHOT.items() for n in by_node}
    assert "no data (live cluster needed)" not in dom
    for text in ("Save stall", "Time to resume", "Restore phases, zoomed in"):
        assert text in dom
    return page


def _screenshot(chromium: str, profile: pathlib.Path, url: str, name: str, height: int = 2600) -> pathlib.Path:
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / name
    screenshot.unlink(missing_ok=True)
    shot = _run_chromium(chromium, profile, f"--screenshot={screenshot}", f"--window-size=1400,{height}", url)
    assert shot.returncode == 0, shot.stderr[-3000:]
    assert _console_lines(shot.stderr) == []
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 20_000  # a drawn page, not a blank one
    return screenshot


def test_dashboard_renders_recorded_recoveries(chromium: str, dashboard_url: str, tmp_path: pathlib.Path) -> None:
    dumped = _run_chromium(chromium, tmp_path / "profile-dom", "--dump-dom", dashboard_url)
    assert dumped.returncode == 0, dumped.stderr[-3000:]
    _check_page(dumped.stdout, dumped.stderr)
    _screenshot(chromium, tmp_path / "profile-shot", dashboard_url, "dashboard.png")


def _export_report(events_file: pathlib.Path, report: pathlib.Path) -> str:
    """``ray-ckpt dashboard --events events_file --export report``, asserting that it exited 0;
    what it printed."""
    command = ["dashboard", "--events", str(events_file), "--export", str(report)]
    done = subprocess.run(
        [sys.executable, "-m", "ray_ckpt.tools.cli", *command],
        capture_output=True,
        text=True,
        timeout=pace.bound(120),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_exported_report_renders_without_a_server(chromium: str, tmp_path: pathlib.Path) -> None:
    events_file = recorded_events.write(tmp_path / "events.jsonl")
    report = tmp_path / "report.html"
    assert "2 recoveries, 1 failed" in _export_report(events_file, report)
    dumped = _run_chromium(chromium, tmp_path / "profile", "--dump-dom", report.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-3000:]
    _check_page(dumped.stdout, dumped.stderr)
    _screenshot(chromium, tmp_path / "profile-shot", report.as_uri(), "dashboard-report.png")


def test_single_point_charts_have_axes_around_the_point(chromium: str, tmp_path: pathlib.Path) -> None:
    """One recovery and one recorded save step: each chart has one x tick at the point's value
    (no -1..1 axis), the point centred, and y ticks from 0 up to at least the point."""
    records = recorded_events.single_point_records()
    events_file = recorded_events.write(tmp_path / "events.jsonl", records)
    report = tmp_path / "report.html"
    _export_report(events_file, report)
    dumped = _run_chromium(chromium, tmp_path / "profile", "--dump-dom", report.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-3000:]
    page = _Dom(dumped.stdout).root
    assert page.find("body").attrs.get("data-rendered")
    assert page.find("div", id="errors").text().strip() == ""
    assert _console_lines(dumped.stderr) == []
    (recovery,) = timeline.recoveries(records)
    for panel, x_value, y_value in (
        ("panel-stall", 0.0, None),  # both ranks saved step 0 only
        ("panel-resume", recovery.kill_time, recovery.time_to_resume_s),
    ):
        chart = page.find("section", id=panel).find("svg", cls="chart")
        assert [float(v) for v in (chart.attrs["data-x-ticks"] or "").split(",")] == pytest.approx([x_value])
        y_ticks = [float(v) for v in (chart.attrs["data-y-ticks"] or "").split(",")]
        assert min(y_ticks) == 0 and all(v >= 0 for v in y_ticks)
        middle = (float(chart.attrs["data-plot-left"] or "0") + float(chart.attrs["data-plot-right"] or "0")) / 2
        points = chart.find_all("circle", cls="point")
        assert points and all(float(p.attrs["cx"] or "0") == pytest.approx(middle, abs=1) for p in points)
        for point in points:
            assert float(point.attrs["data-y"] or "0") <= max(y_ticks)
        if y_value is not None:
            assert [float(p.attrs["data-y"] or "0") for p in points] == pytest.approx([y_value])
    _screenshot(chromium, tmp_path / "profile-shot", report.as_uri(), "dashboard-single-point.png", height=1400)
