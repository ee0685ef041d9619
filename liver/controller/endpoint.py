"""The control endpoint: loopback HTTP, every request carries the job's token.

``POST /scale`` with ``{"action": "scale-out 4"}`` (the events-file grammar) queues an event after
the controller validated it (400 with the reason otherwise; nothing changes); ``GET /status``
returns the controller's state; ``GET /queue`` lists the events waiting, and ``POST /withdraw``
with ``{"position": N}`` takes the N-th back (refused if the events after it would not hold);
``POST /end`` with ``{"after": N}`` ends the job N steps from now (``liver stop``);
``GET /metrics`` is the Prometheus text for operators; ``POST /agent/register``,
``POST /agent/sync`` and ``POST /agent/wait`` are the node agents' (``liver.protocol.agent``; a
wait is held until the node has a command, up to its sync interval: ``controller.long_poll``). A request without the right
``Authorization: Bearer TOKEN`` gets 401 and is not looked at further. Connections are kept open
(HTTP/1.1): an agent syncs ten times a second over one.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable


MAX_BODY_BYTES = 64 << 10  # an action is a line of text
READ_TIMEOUT_S = 60.0      # per read of a request (an agent's link sends ten a second)


def _short(text: str, n: int = 80) -> str:
    """A user's text in an error message, cut short (a megabyte of it is not echoed back)."""
    return text if len(text) <= n else text[:n] + f"... ({len(text)} characters)"


def new_token() -> str:
    """A bearer token for the endpoint: 192 random bits in hex, never a leading "-" that a CLI
    (``liver status --token T``) would take for an option."""
    return secrets.token_hex(24)


class _Server(ThreadingHTTPServer):
    """Its listening queue holds every node's agent connecting at once (socketserver's default, 5,
    resets the rest: measured with 300 agents registering together, `liver bench control-plane`)."""

    request_queue_size = 4096
    daemon_threads = True


class ControlEndpoint:
    def __init__(self, submit: Callable[[str], dict[str, Any]], status: Callable[[], dict[str, Any]],
                 run_dir: Path, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 queue: Callable[[], dict[str, Any]] | None = None,
                 withdraw: Callable[[int], dict[str, Any]] | None = None,
                 agents: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
                 metrics: Callable[[], tuple[str, bytes]] | None = None,
                 end: Callable[[int], dict[str, Any]] | None = None) -> None:
        """``GET /status``, ``POST /scale {"action": ...}``; with ``queue`` and ``withdraw`` also
        ``GET /queue`` and ``POST /withdraw {"position": N}``; with ``agents``, ``POST /agent/WHAT``
        (``agents(WHAT, body)``); with ``metrics``, ``GET /metrics`` (its content type and body);
        with ``end``, ``POST /end {"after": N}`` (the job ends N steps from now)."""
        routes = "GET /status, GET /queue, GET /metrics, POST /scale, POST /withdraw, POST /agent/register, " \
                 "POST /agent/sync, POST /agent/wait, POST /end"
        self.token = token or new_token()
        token_bytes = self.token.encode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = READ_TIMEOUT_S  # a client that stops sending mid-request is let go
            # an answer's headers and body go out in two writes: with Nagle's algorithm the body
            # waits for the client's delayed acknowledgement of the headers (40 ms on Linux, seen
            # on a third of the commands to an agent: `liver bench control-plane`)
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                return

            def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
                """What the HTTP layer refuses itself (a bad request line, an unknown method, too
                many headers): JSON, as every other answer."""
                self.close_connection = True
                try:
                    self._reply(code, {"error": _short(message or explain or f"HTTP {code}", 200)})
                except OSError:
                    pass

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except (ConnectionError, TimeoutError):
                    self.close_connection = True
                except Exception:  # a bug of ours: a JSON 500 and the traceback in the log, not the terminal
                    logging.getLogger("liver.controller").exception("control endpoint: request failed")
                    self.send_error(500, "internal error (see the controller's log)")

            def _reply(self, code: int, body: dict[str, Any], kind: str = "application/json",
                       data: bytes | None = None) -> None:
                data = json.dumps(body).encode() if data is None else data
                if self.request_version == "HTTP/0.9":  # (a request line without a version, or none
                    self.request_version = self.protocol_version  # it could parse: an answer with headers
                    self.close_connection = True                  # all the same, then the end)
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                given = self.headers.get("Authorization", "")
                ok = given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), token_bytes)
                if not ok:
                    self.close_connection = True  # (a body it sent is not read)
                    self._reply(401, {"error": "missing or wrong token (Authorization: Bearer TOKEN)"})
                return ok

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if self.path == "/queue" and queue is not None:
                    return self._reply(200, queue())
                if self.path == "/metrics" and metrics is not None:
                    kind, data = metrics()
                    return self._reply(200, {}, kind, data)
                if self.path != "/status":
                    return self._reply(404, {"error": f"path {_short(self.path)!r}: allowed {routes}"})
                self._reply(200, status())

            def do_POST(self) -> None:
                if not self._authorised():
                    return
                agent_path = agents is not None and self.path in ("/agent/register", "/agent/sync", "/agent/wait")
                if not agent_path and (self.path not in ("/scale", "/withdraw", "/end")
                                       or (self.path == "/withdraw" and withdraw is None)
                                       or (self.path == "/end" and end is None)):
                    self.close_connection = True  # (its body is not read)
                    return self._reply(404, {"error": f"path {_short(self.path)!r}: allowed {routes}"})
                if "Transfer-Encoding" in self.headers:  # (chunked: its chunks would read as requests)
                    self.close_connection = True
                    return self._reply(411, {"error": f"Transfer-Encoding {_short(self.headers['Transfer-Encoding'])!r}: "
                                                      f"not taken; send the body whole, with a Content-Length"})
                length = self.headers.get("Content-Length", "0")
                if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                    self.close_connection = True  # the body is not read
                    return self._reply(413, {"error": f"Content-Length {_short(length)!r}: allowed up to "
                                                      f"{MAX_BODY_BYTES} bytes"})
                if agent_path:
                    try:
                        body = json.loads(self.rfile.read(int(length)) or b"{}")
                        if not isinstance(body, dict):
                            raise ValueError("body: expected a JSON object")
                        return self._reply(200, agents(self.path.rsplit("/", 1)[1], body))
                    except (ValueError, RecursionError) as e:
                        return self._reply(400, {"error": _short(str(e), 400)})
                key, kind = {"/scale": ("action", str), "/withdraw": ("position", int), "/end": ("after", int)}[self.path]
                try:
                    body = json.loads(self.rfile.read(int(length)) or b"{}")
                    value = body[key]
                    if not isinstance(value, kind) or isinstance(value, bool):
                        raise ValueError
                except (ValueError, KeyError, TypeError, RecursionError):
                    example = '"scale-out N ..."' if key == "action" else "N"
                    return self._reply(400, {"error": f"body: expected JSON {{\"{key}\": {example}}}"})
                try:
                    self._reply(202, {"action": submit, "position": withdraw, "after": end}[key](value))
                except ValueError as e:
                    self._reply(400, {"error": _short(str(e), 400)})

            def _not_allowed(self) -> None:
                self.close_connection = True
                self._reply(405, {"error": f"method {self.command}: allowed {routes}"})

            do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed

        self.server = _Server((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="control", daemon=True)
        self.thread.start()
        # written whole, then put in place: a reader that sees the file sees all of it (owner only)
        info, tmp = run_dir / "control.json", run_dir / f".control.json.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"url": self.url, "token": self.token}, f)
        os.replace(tmp, info)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def request(url: str, token: str | None, method: str, path: str, body: dict[str, Any] | None = None,
            timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    """A client call (``liver scale``, tests); returns (HTTP status, JSON body)."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
