"""The control endpoint: loopback HTTP, every request carries the job's token.

``POST /scale`` with ``{"action": "scale-out 4"}`` (the events-file grammar) queues an event after
the controller validated it (400 with the reason otherwise; nothing changes); ``GET /status``
returns the controller's state; ``GET /queue`` lists the events waiting, and ``POST /withdraw``
with ``{"position": N}`` takes the N-th back (refused if the events after it would not hold). A request without the right ``Authorization: Bearer TOKEN`` gets
401 and is not looked at further.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable


MAX_BODY_BYTES = 64 << 10  # an action is a line of text


def _short(text: str, n: int = 80) -> str:
    """A user's text in an error message, cut short (a megabyte of it is not echoed back)."""
    return text if len(text) <= n else text[:n] + f"... ({len(text)} characters)"


class ControlEndpoint:
    def __init__(self, submit: Callable[[str], dict[str, Any]], status: Callable[[], dict[str, Any]],
                 run_dir: Path, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 queue: Callable[[], dict[str, Any]] | None = None,
                 withdraw: Callable[[int], dict[str, Any]] | None = None) -> None:
        """``GET /status``, ``POST /scale {"action": ...}``; with ``queue`` and ``withdraw`` also
        ``GET /queue`` and ``POST /withdraw {"position": N}``."""
        routes = "GET /status, GET /queue, POST /scale, POST /withdraw"
        self.token = token or secrets.token_urlsafe(24)
        token_bytes = self.token.encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                given = self.headers.get("Authorization", "")
                ok = given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), token_bytes)
                if not ok:
                    self._reply(401, {"error": "missing or wrong token (Authorization: Bearer TOKEN)"})
                return ok

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if self.path == "/queue" and queue is not None:
                    return self._reply(200, queue())
                if self.path != "/status":
                    return self._reply(404, {"error": f"path {_short(self.path)!r}: allowed {routes}"})
                self._reply(200, status())

            def do_POST(self) -> None:
                if not self._authorised():
                    return
                if self.path not in ("/scale", "/withdraw") or (self.path == "/withdraw" and withdraw is None):
                    return self._reply(404, {"error": f"path {_short(self.path)!r}: allowed {routes}"})
                length = self.headers.get("Content-Length", "0")
                if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                    self.close_connection = True  # the body is not read
                    return self._reply(413, {"error": f"Content-Length {_short(length)!r}: allowed up to "
                                                      f"{MAX_BODY_BYTES} bytes"})
                key, kind = ("action", str) if self.path == "/scale" else ("position", int)
                try:
                    body = json.loads(self.rfile.read(int(length)) or b"{}")
                    value = body[key]
                    if not isinstance(value, kind) or isinstance(value, bool):
                        raise ValueError
                except (ValueError, KeyError, TypeError, RecursionError):
                    example = '"scale-out N ..."' if key == "action" else "N"
                    return self._reply(400, {"error": f"body: expected JSON {{\"{key}\": {example}}}"})
                try:
                    self._reply(202, submit(value) if key == "action" else withdraw(value))
                except ValueError as e:
                    self._reply(400, {"error": _short(str(e), 400)})

            def _not_allowed(self) -> None:
                self._reply(405, {"error": f"method {self.command}: allowed {routes}"})

            do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="control", daemon=True)
        self.thread.start()
        info = run_dir / "control.json"
        fd = os.open(info, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"url": self.url, "token": self.token}, f)

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
