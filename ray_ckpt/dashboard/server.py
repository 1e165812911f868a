"""``ray-ckpt dashboard``: a small web server (standard library only) for the dashboard page.

Routes: ``/`` the page, ``/static/<file>`` its CSS and JS, ``/api/data`` everything the page
draws (``ray_ckpt.dashboard.data.build``). Data comes from recorded events files (re-read when
they change) and/or, live, from a running cluster: the registry's events, ``ray_ckpt.status()``
and the placement of each job's newest committed step (queried at most once a second; the page
polls every 2 s). ``--export report.html`` writes one self-contained HTML file instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import pathlib
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ray_ckpt import settings
from ray_ckpt.core import events as events_module
from ray_ckpt.dashboard.data import build
from ray_ckpt.errors import DashboardError

logger = logging.getLogger(__name__)

STATIC = pathlib.Path(__file__).resolve().parent / "static"
STATIC_FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
DEFAULT_PORT = 8266
LIVE_MIN_INTERVAL_S = 1.0
_CSS_TAG = '<link rel="stylesheet" href="static/style.css">'
_JS_TAG = '<script src="static/app.js"></script>'


class EventFiles:
    """Recorded events files, re-read only when their size or modification time changes."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = [pathlib.Path(p) for p in paths]
        for path in self.paths:
            if not path.is_file():
                raise DashboardError(f"no events file at {path}")
        self._cache: dict[pathlib.Path, tuple[tuple[float, int], list[dict[str, Any]]]] = {}

    def read(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for path in self.paths:
            try:
                stat = path.stat()
            except OSError:
                continue
            key = (stat.st_mtime, stat.st_size)
            cached = self._cache.get(path)
            if cached is None or cached[0] != key:
                cached = (key, events_module.read(path))
                self._cache[path] = cached
            records.extend(cached[1])
        return records

    def names(self) -> list[str]:
        return [p.name for p in self.paths]


class LiveCluster:
    """Reads a running cluster (the caller connected this process to it with ray.init)."""

    def __init__(self, namespace: str, timeout_s: float = 10.0) -> None:
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._since = 0
        self._events: list[dict[str, Any]] = []

    def snapshot(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(every event the registry logged so far, the live part for ``data.build``, with Ray's
        node records for hosts)."""
        from ray_ckpt import service
        from ray_ckpt.core.wire import ranks_to_wire
        from ray_ckpt.errors import StoreUnavailableError
        from ray_ckpt.transport import naming
        from ray_ckpt.transport.registry_client import RegistryClient

        registry = None
        with contextlib.suppress(StoreUnavailableError):  # no registry (yet): status() still shows the stores
            registry = RegistryClient(self.namespace)
        if registry is not None:
            following, new = registry.events(self._since)
            if following < self._since:  # the registry restarted: its numbering starts again
                following, new = registry.events(0)
            self._events.extend(new)
            self._since = following
        status = service.status(namespace=self.namespace, timeout_s=self.timeout_s)
        ray_nodes = naming.nodes()
        alive = [n.node_id for n in ray_nodes if n.alive]
        placements = {}
        if registry is not None:
            for job, info in status.get("jobs", {}).items():
                step = info.get("latest_committed")
                if step is not None:
                    placements[job] = {"step": step, "ranks": ranks_to_wire(registry.locate(job, step))}
        return list(self._events), {"status": status, "alive": alive, "placements": placements, "ray_nodes": ray_nodes}


class Dashboard:
    """Assembles ``/api/data`` from events files and/or a live cluster (thread-safe)."""

    def __init__(self, files: EventFiles | None = None, live: LiveCluster | None = None) -> None:
        self.files = files
        self.live = live
        self._lock = threading.Lock()
        self._live_cache: tuple[float, list[dict[str, Any]], dict[str, Any] | None, str | None] | None = None

    def data(self) -> dict[str, Any]:
        with self._lock:
            records = self.files.read() if self.files is not None else []
            live_part = None
            error = None
            if self.live is not None:
                now = time.monotonic()
                if self._live_cache is None or now - self._live_cache[0] >= LIVE_MIN_INTERVAL_S:
                    try:
                        live_events, live_part = self.live.snapshot()
                        self._live_cache = (now, live_events, live_part, None)
                    except Exception as failure:  # shown on the page; the last good data stays
                        logger.warning("dashboard: reading the cluster failed: %s", failure)
                        old = self._live_cache
                        message = f"{type(failure).__name__}: {failure}".splitlines()[0]
                        self._live_cache = (now, old[1] if old else [], old[2] if old else None, message)
                _, live_events, live_part, error = self._live_cache
                records = records + live_events
            sources = self.files.names() if self.files is not None else []
            return build(_unique(records), live_part if self.live is not None else None, sources=sources, error=error)


def _unique(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events without duplicates (the same event from a file and from the live registry)."""
    seen = set()
    result = []
    for record in records:
        key = json.dumps(record, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            result.append(record)
    return result


# ---- HTML -----------------------------------------------------------------------------------


def _static(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def _script_json(value: Any) -> str:
    """JSON safe to inline in a <script> element."""
    text = json.dumps(value, separators=(",", ":"), default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def export_html(data: dict[str, Any]) -> str:
    """One self-contained HTML page (CSS, JS and data inlined) showing ``data`` without a server."""
    page = _static("index.html")
    if _CSS_TAG not in page or _JS_TAG not in page:
        raise DashboardError("the dashboard page template lacks its style or script tag")
    css = f"<style>\n{_static('style.css')}</style>"
    script = _static("app.js").replace("</script", "<\\/script")
    inline = f"<script>window.RAY_CKPT_DATA = {_script_json(data)};</script>\n<script>\n{script}</script>"
    return page.replace(_CSS_TAG, css).replace(_JS_TAG, inline)


def _clean(value: Any) -> Any:
    """NaN and infinities (not JSON) become None."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


# ---- HTTP -----------------------------------------------------------------------------------


def make_server(dashboard: Dashboard, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> ThreadingHTTPServer:
    """A threaded HTTP server for ``dashboard`` (port 0: any free port; see ``server_address``)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "ray_ckpt-dashboard"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, _static("index.html").encode(), "text/html")
            elif path.startswith("/static/") and path[len("/static/") :] in STATIC_FILES:
                name = path[len("/static/") :]
                self._send(HTTPStatus.OK, _static(name).encode(), STATIC_FILES[name])
            elif path == "/api/data":
                try:
                    body = json.dumps(_clean(dashboard.data()), default=str, allow_nan=False).encode()
                except Exception as error:
                    logger.exception("dashboard: building the data failed")
                    message = json.dumps({"error": f"{type(error).__name__}: {error}"}).encode()
                    self._send(HTTPStatus.INTERNAL_SERVER_ERROR, message, "application/json")
                    return
                self._send(HTTPStatus.OK, body, "application/json")
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

        def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", f"{content_type}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("dashboard: " + format, *args)

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as error:
        raise DashboardError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    server.daemon_threads = True
    return server


# ---- command line ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ray-ckpt dashboard`` (``--address``/``--namespace`` come from the CLI)."""
    parser.add_argument(
        "--events",
        action="append",
        metavar="PATH",
        default=[],
        help="a recorded events file (JSON lines, e.g. the registry's events_path()); repeatable. Without "
        "--address only these files are shown (no cluster needed)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1; 0.0.0.0: all)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT}; 0: any free port)"
    )
    parser.add_argument(
        "--export",
        metavar="FILE",
        help="write one self-contained HTML report (data, JS and CSS inlined) to FILE and exit",
    )


def run(args: argparse.Namespace, connect: Callable[[], bool]) -> int:
    """Serve (or export) the dashboard. Live when ``--address`` is given or no ``--events``:
    ``connect()`` then connects this process to the cluster (True if it did, so it is
    disconnected at the end)."""
    files = EventFiles(args.events) if args.events else None
    live = None
    connected = False
    if args.address is not None or files is None:
        connected = connect()
        live = LiveCluster(args.namespace or settings.namespace())
    try:
        dashboard = Dashboard(files, live)
        if args.export:
            data = _clean(dashboard.data())
            pathlib.Path(args.export).write_text(export_html(data), encoding="utf-8")
            summary = data["summary"]
            print(
                f"wrote {args.export}: {summary['recoveries']} recoveries, {summary['failed_recoveries']} failed, "
                f"{summary['events']} events"
            )
            return 0
        server = make_server(dashboard, args.host, args.port)
        print(f"ray_ckpt dashboard: {_where(args.host, server.server_port)}  (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
        return 0
    finally:
        if connected:
            import ray

            ray.shutdown()


def _where(host: str, port: int) -> str:
    """The banner's URL: the one interface listened on, or for all of them ('' or 0.0.0.0)
    this host's address (127.0.0.1 alone would send a remote operator nowhere)."""
    if host not in ("", "0.0.0.0"):
        return f"http://{host}:{port}/"
    address = host_address()
    if address is None:
        return f"all interfaces, port {port}: http://{socket.gethostname()}:{port}/ or http://127.0.0.1:{port}/ here"
    return f"all interfaces, port {port}: http://{address}:{port}/"


def host_address() -> str | None:
    """This host's IPv4 address on its default route (found by a UDP socket's connect, which
    sends nothing), else the one its name resolves to; None when only loopback is known."""
    found = []
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1 (RFC 5737): only picks the route
        found.append(str(probe.getsockname()[0]))
    with contextlib.suppress(OSError):
        found.append(socket.gethostbyname(socket.gethostname()))
    return next((a for a in found if not a.startswith("127.") and a != "0.0.0.0"), None)


def serve_in_thread(dashboard: Dashboard, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Start a server on a background thread (for tests and notebooks); ``shutdown()`` stops it."""
    server = make_server(dashboard, host, port)
    threading.Thread(target=server.serve_forever, name="ray_ckpt-dashboard", daemon=True).start()
    return server


__all__ = [
    "Dashboard",
    "DashboardError",
    "EventFiles",
    "LiveCluster",
    "add_arguments",
    "export_html",
    "make_server",
    "run",
    "serve_in_thread",
]
