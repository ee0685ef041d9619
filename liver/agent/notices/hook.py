"""Notices from anything else: a file that appears (a cluster's own drain script writes it; its
content, if any, is the seconds left), or ``POST /notice`` with ``{"deadline_s": N}`` to the agent
on loopback, with the job's token."""

from __future__ import annotations

import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from liver.agent.notices import Watcher
from liver.protocol.agent import Notice


def _deadline(text: str, default_s: float, where: str) -> float:
    text = text.strip()
    if not text:
        return default_s
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {text[:40]!r}: allowed the seconds left, or nothing") from None
    if not 0 <= value <= 86400:
        raise ValueError(f"{where}: deadline {value!r}: allowed 0 to 86400 s")
    return value


class FileWatcher(Watcher):
    source = "file"

    def __init__(self, path: str, default_s: float = 30.0, poll_s: float = 0.2) -> None:
        super().__init__(poll_s)
        self.path, self.default_s = Path(path), default_s

    def check(self) -> Notice | None:
        if not self.path.exists():
            return None
        return Notice(source=f"file {self.path}", deadline_s=_deadline(self.path.read_text(), self.default_s,
                                                                       str(self.path)))


class HttpHook(Watcher):
    source = "http"

    def __init__(self, port: int, token: str | None, default_s: float = 30.0, host: str = "127.0.0.1") -> None:
        super().__init__()
        if token is None:
            raise ValueError("--notice-http: needs the job's token (--token or LIVER_TOKEN) to check callers")
        watcher, want = self, token.encode()

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

            def do_POST(self) -> None:
                given = self.headers.get("Authorization", "")
                if not (given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), want)):
                    return self._reply(401, {"error": "missing or wrong token (Authorization: Bearer TOKEN)"})
                if self.path != "/notice":
                    return self._reply(404, {"error": f"path {self.path[:80]!r}: allowed POST /notice"})
                length = self.headers.get("Content-Length", "0")
                if not length.isdigit() or int(length) > 4096:
                    return self._reply(413, {"error": "Content-Length: allowed up to 4096 bytes"})
                try:
                    body = json.loads(self.rfile.read(int(length)) or b"{}")
                    value = body.get("deadline_s", default_s) if isinstance(body, dict) else None
                    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 86400:
                        raise ValueError
                except ValueError:
                    return self._reply(400, {"error": 'body: expected JSON {"deadline_s": N} with N 0 to 86400'})
                if watcher._notice is None:
                    watcher._notice = Notice(source="http hook", deadline_s=float(value))
                self._reply(202, {"accepted": watcher._notice.source, "deadline_s": watcher._notice.deadline_s})

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]

    def start(self) -> "HttpHook":
        threading.Thread(target=self.server.serve_forever, name="notice-http", daemon=True).start()
        return self

    def check(self) -> Notice | None:
        return self._notice

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
