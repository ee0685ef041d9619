"""Each source of preemption notices against a fake server on loopback (or a real signal, a real
file): nothing until the provider says so, then one notice with the deadline it gave."""

import json
import os
import signal
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from liver.agent.notices import aws, azure, gcp, hook, sigterm
from liver.controller.endpoint import request
from liver.protocol.agent import IGNORE_SIGTERM


class Fake:
    """A metadata server: ``routes[(method, path)]`` -> (status, body), changed by the test."""

    def __init__(self):
        self.routes = {}
        self.headers = []
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                return

            def _any(self):
                fake.headers.append((self.command, self.path, dict(self.headers)))
                code, body = fake.routes.get((self.command, self.path), (404, ""))
                if callable(body):
                    code, body = body(self)
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    f = Fake()
    yield f
    f.close()


def test_aws_spot_instance_action_with_an_imdsv2_token(fake):
    fake.routes[("PUT", "/latest/api/token")] = (200, "tok-1")

    def action(h):
        if h.headers.get("X-aws-ec2-metadata-token") != "tok-1":
            return 401, ""
        return state["code"], state["body"]

    state = {"code": 404, "body": ""}
    fake.routes[("GET", "/latest/meta-data/spot/instance-action")] = (0, action)
    w = aws.AwsSpotWatcher(fake.url)
    assert w.check() is None  # no interruption scheduled
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
    state.update(code=200, body={"action": "terminate", "time": when})
    n = w.check()
    assert n.source == "aws spot terminate" and 115 <= n.deadline_s <= 120
    put = next(h for m, p, h in fake.headers if m == "PUT")
    assert {k.lower(): v for k, v in put.items()}["x-aws-ec2-metadata-token-ttl-seconds"] == str(aws.TOKEN_TTL_S)


def test_aws_without_imdsv2_asks_without_a_token(fake):
    fake.routes[("PUT", "/latest/api/token")] = (403, "")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5))  # already past
    fake.routes[("GET", "/latest/meta-data/spot/instance-action")] = (200, {"action": "stop", "time": when})
    n = aws.AwsSpotWatcher(fake.url).check()
    assert n.source == "aws spot stop" and n.deadline_s == 0.0
    assert "X-aws-ec2-metadata-token" not in fake.headers[-1][2]


def test_gcp_preempted_needs_its_header_and_says_true_once_preempted(fake):
    state = {"value": "FALSE"}

    def preempted(h):
        if h.headers.get("Metadata-Flavor") != "Google":
            return 403, ""
        return 200, state["value"]

    fake.routes[("GET", "/computeMetadata/v1/instance/preempted")] = (0, preempted)
    w = gcp.GcpPreemptedWatcher(fake.url)
    assert w.check() is None
    state["value"] = "TRUE"
    n = w.check()
    assert n.source == "gcp preempted" and n.deadline_s == gcp.GCP_NOTICE_S
    state["value"] = "<html>"
    with pytest.raises(ValueError, match="unexpected answer"):
        w.check()


def test_azure_preempt_among_other_scheduled_events(fake):
    doc = {"DocumentIncarnation": 1, "Events": [
        {"EventId": "A", "EventType": "Freeze", "Resources": ["vm1"], "NotBefore": ""}]}
    fake.routes[("GET", azure.PATH)] = (0, lambda h: (200 if h.headers.get("Metadata") == "true" else 400, doc))
    w = azure.AzurePreemptWatcher(fake.url, vm="vm1")
    assert w.check() is None  # a freeze is no preemption
    doc["Events"].append({"EventId": "B", "EventType": "Preempt", "Resources": ["vm2"],
                          "NotBefore": formatdate(time.time() + 30, usegmt=True)})
    assert w.check() is None  # another VM's
    doc["Events"].append({"EventId": "C", "EventType": "Preempt", "Resources": ["vm1"],
                          "NotBefore": formatdate(time.time() + 30, usegmt=True)})
    n = w.check()
    assert n.source == "azure Preempt C" and 27 <= n.deadline_s <= 30


def test_a_watcher_polls_in_its_own_thread_and_survives_a_server_that_is_down(fake):
    state = {"value": "FALSE"}
    fake.routes[("GET", "/computeMetadata/v1/instance/preempted")] = (0, lambda h: (200, state["value"]))
    down = gcp.GcpPreemptedWatcher("http://127.0.0.1:9", poll_s=0.05, timeout_s=0.2).start()  # nothing listens
    w = gcp.GcpPreemptedWatcher(fake.url, poll_s=0.05).start()
    try:
        time.sleep(0.3)
        assert w() is None and down() is None
        state["value"] = "TRUE"
        end = time.time() + 5
        while w() is None and time.time() < end:
            time.sleep(0.02)
        assert w().deadline_s == 30.0 and down.errors >= 1
    finally:
        w.stop()
        down.stop()


def test_a_file_hook(tmp_path):
    path = tmp_path / "drain"
    w = hook.FileWatcher(str(path), default_s=45)
    assert w.check() is None
    path.write_text("")
    assert w.check().deadline_s == 45
    path.write_text("12.5\n")
    assert w.check().deadline_s == 12.5 and w.check().source == f"file {path}"
    path.write_text("soon")
    with pytest.raises(ValueError, match="'soon': allowed the seconds left"):
        w.check()


def test_an_http_hook_takes_a_notice_with_the_token_only():
    h = hook.HttpHook(0, "secret").start()
    url = f"http://127.0.0.1:{h.port}"
    try:
        assert request(url, "wrong", "POST", "/notice", {"deadline_s": 5})[0] == 401
        assert request(url, "secret", "POST", "/notice", {"deadline_s": "soon"})[0] == 400
        assert request(url, "secret", "POST", "/other", {})[0] == 404
        assert h() is None
        code, body = request(url, "secret", "POST", "/notice", {"deadline_s": 5})
        assert code == 202 and body["deadline_s"] == 5.0 and h().deadline_s == 5.0
    finally:
        h.stop()
    with pytest.raises(ValueError, match="needs the job's token"):
        hook.HttpHook(0, None)


def test_sigterm_is_a_notice_and_the_workers_ignore_it(monkeypatch):
    monkeypatch.delenv(IGNORE_SIGTERM, raising=False)
    before = signal.getsignal(signal.SIGTERM)
    w = sigterm.SigtermWatcher(25).start()
    try:
        assert w() is None and os.environ[IGNORE_SIGTERM] == "1"
        os.kill(os.getpid(), signal.SIGTERM)  # the process lives on
        end = time.time() + 2
        while w() is None and time.time() < end:
            time.sleep(0.01)
        assert w().source == "SIGTERM" and w().deadline_s == 25
    finally:
        w.stop()
        signal.signal(signal.SIGTERM, before)
    with pytest.raises(ValueError, match="--notice-sigterm=0"):
        sigterm.SigtermWatcher(0)
