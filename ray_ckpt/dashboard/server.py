"""``ray-ckpt dashboard``: a small web server (standard library only) for the dashboard page.

Routes: ``/`` the page, ``/static/<file>`` its CSS and JS, ``/api/data`` everything the page
draws (``ray_ckpt.dashboard.data``). Data comes from recorded events files (read as they grow)
and/or, live, from a running cluster: the registry's new events, ``ray_ckpt.status()`` and the
placement of each job's newest committed step (queried at most once a second; the page polls
every 2 s). The events go into one ``EventWindow``, bounded by RAY_CKPT_DASHBOARD_EVENTS_MAX_BYTES
and RAY_CKPT_DASHBOARD_EVENTS_MAX_AGE_S, and each poll folds in only the new ones.
``--export report.html`` writes one self-contained HTML file instead.

A request whose ``Host`` header names neither this machine's loopback (``localhost``, an IP
address), the host the server was bound to (for all interfaces: this host's name), nor one passed
with ``--allow-host`` is refused with 403: a web page on another site cannot read the dashboard
by pointing its own name at this machine (DNS rebinding).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import os
import pathlib
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ray_ckpt import settings
from ray_ckpt.core import events as events_module
from ray_ckpt.dashboard.data import EventWindow
from ray_ckpt.errors import DashboardError

logger = logging.getLogger(__name__)

STATIC = pathlib.Path(__file__).resolve().parent / "static"
STATIC_FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
DEFAULT_PORT = 8266
LIVE_MIN_INTERVAL_S = 1.0
_CSS_TAG = '<link rel="stylesheet" href="static/style.css">'
_JS_TAG = '<script src="static/app.js"></script>'
_ALL_INTERFACES = ("", "0.0.0.0", "::")


class EventFiles:
    """Recorded events files, read as they grow: ``read`` returns the lines appended since the
    call before (a file replaced or cut shorter, as a rotation does, is read from its start)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = [pathlib.Path(p) for p in paths]
        for path in self.paths:
            if not path.is_file():
                raise DashboardError(f"no events file at {path}")
        self._read: dict[pathlib.Path, tuple[int, int]] = {}  # path -> (its inode, bytes read: whole lines)

    def read(self) -> list[Any]:
        """The events of the lines new since the last call, parsed, not checked (the window
        checks them); a last line without its newline is given each time until it has one."""
        records: list[Any] = []
        for path in self.paths:
            try:
                with path.open("rb") as file:
                    stat = os.fstat(file.fileno())
                    inode, offset = self._read.get(path, (stat.st_ino, 0))
                    if inode != stat.st_ino or stat.st_size < offset:
                        offset = 0
                    file.seek(offset)
                    chunk = file.read()
            except OSError:
                continue
            whole = chunk.rfind(b"\n") + 1
            self._read[path] = (stat.st_ino, offset + whole)
            lines = chunk.decode("utf-8", errors="replace").splitlines()
            records.extend(events_module.parse(lines, checked=False))
        return records

    def names(self) -> list[str]:
        return [p.name for p in self.paths]


class LiveCluster:
    """Reads a running cluster (the caller connected this process to it with ray.init)."""

    def __init__(self, namespace: str, timeout_s: float = 10.0) -> None:
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._since = 0

    def snapshot(self, new_events: Callable[[list[dict[str, Any]]], object]) -> dict[str, Any]:
        """The live part for ``data.build``, with Ray's node records for hosts; first hands the
        events the registry logged since the last call to ``new_events``."""
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
            new_events(new)
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
        return {"status": status, "alive": alive, "placements": placements, "ray_nodes": ray_nodes}


class Dashboard:
    """Assembles ``/api/data`` from events files and/or a live cluster (thread-safe). The events
    go into ``window`` (by default bounded by RAY_CKPT_DASHBOARD_EVENTS_MAX_BYTES and
    RAY_CKPT_DASHBOARD_EVENTS_MAX_AGE_S), the new ones at each call."""

    def __init__(
        self, files: EventFiles | None = None, live: LiveCluster | None = None, *, window: EventWindow | None = None
    ) -> None:
        self.files = files
        self.live = live
        if window is None:
            window = EventWindow(
                max_bytes=settings.dashboard_events_max_bytes(), max_age_s=settings.dashboard_events_max_age_s()
            )
        self.window = window
        self._lock = threading.Lock()
        self._live_cache: tuple[float, dict[str, Any] | None, str | None] | None = None

    def data(self) -> dict[str, Any]:
        with self._lock:
            if self.files is not None:
                self.window.add(self.files.read())
            live_part = None
            error = None
            if self.live is not None:
                now = time.monotonic()
                if self._live_cache is None or now - self._live_cache[0] >= LIVE_MIN_INTERVAL_S:
                    try:
                        self._live_cache = (now, self.live.snapshot(self.window.add), None)
                    except Exception as failure:  # shown on the page; the last good data stays
                        logger.warning("dashboard: reading the cluster failed: %s", failure)
                        message = f"{type(failure).__name__}: {failure}".splitlines()[0]
                        self._live_cache = (now, self._live_cache[1] if self._live_cache else None, message)
                _, live_part, error = self._live_cache
            sources = self.files.names() if self.files is not None else []
            return self.window.data(live_part, sources=sources, error=error)


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


def host_names(host: str, allowed_hosts: Iterable[str] = ()) -> frozenset[str]:
    """The names a request's ``Host`` may give for a server bound to ``host`` (IP addresses and
    ``localhost`` are always fine: ``host_allowed``): ``host`` itself, for all interfaces this
    host's name, and ``allowed_hosts`` ("*": any name)."""
    names = {_host_of(name) for name in allowed_hosts}
    if host in _ALL_INTERFACES:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    else:
        names.add(_host_of(host))
    return frozenset(names)


def host_allowed(header: str | None, names: frozenset[str]) -> bool:
    """Whether a request with this ``Host`` header is answered: one naming an IP address,
    ``localhost`` or one of ``names`` (``host_names``), or none (not a browser: a browser always
    sends one). A DNS name pointed at this machine by someone else is refused."""
    if header is None or "*" in names:
        return True
    name = _host_of(header)
    if name in names or name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)  # an address names the machine itself: nothing to rebind
    except ValueError:
        return False
    return True


def _host_of(header: str) -> str:
    """The name of a ``Host`` header: lower case, without its port, brackets or final dot."""
    name = header.strip().lower()
    if name.startswith("["):  # [IPv6 address]:port
        name = name[1 : name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    return name.rstrip(".")


def make_server(
    dashboard: Dashboard, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, allowed_hosts: Iterable[str] = ()
) -> ThreadingHTTPServer:
    """A threaded HTTP server for ``dashboard`` (port 0: any free port; see ``server_address``)
    that answers only requests whose ``Host`` ``host_allowed`` takes (``host_names``)."""
    names = host_names(host, allowed_hosts)

    class Handler(BaseHTTPRequestHandler):
        server_version = "ray_ckpt-dashboard"

        def do_GET(self) -> None:
            if not host_allowed(self.headers.get("Host"), names):
                refused = (
                    f"refused: this ray_ckpt dashboard does not answer to Host {self.headers.get('Host')!r} "
                    "(a name another site could point at this machine: DNS rebinding). Open it by its IP "
                    "address or localhost, or restart it with --allow-host NAME (repeatable; '*': any name).\n"
                )
                self._send(HTTPStatus.FORBIDDEN, refused.encode(), "text/plain")
                return
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
        "--allow-host",
        action="append",
        metavar="NAME",
        default=[],
        help="a host name the page may be opened by (the Host header), besides IP addresses, localhost and the "
        "--host name (for all interfaces: this host's name); repeatable; '*': any. Other names get 403, so a site "
        "cannot read the dashboard through DNS rebinding",
    )
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
        server = make_server(dashboard, args.host, args.port, allowed_hosts=args.allow_host)
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


def serve_in_thread(
    dashboard: Dashboard, host: str = "127.0.0.1", port: int = 0, *, allowed_hosts: Iterable[str] = ()
) -> ThreadingHTTPServer:
    """Start a server on a background thread (for tests and notebooks); ``shutdown()`` stops it."""
    server = make_server(dashboard, host, port, allowed_hosts=allowed_hosts)
    threading.Thread(target=server.serve_forever, name="ray_ckpt-dashboard", daemon=True).start()
    return server


__all__ = [
    "Dashboard",
    "DashboardError",
    "EventFiles",
    "LiveCluster",
    "add_arguments",
    "export_html",
    "host_allowed",
    "host_names",
    "make_server",
    "run",
    "serve_in_thread",
]
