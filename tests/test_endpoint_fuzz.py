"""The control endpoint under random requests (hypothesis): any method, path, headers and body, with
and without the token. Every answer is JSON with a status code the endpoint documents, nothing is
queued unless the request was a valid action (202), and the endpoint answers the next request."""

from __future__ import annotations

import http.client
import json
import string

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from liver.controller.admission import admit, without
from liver.controller.endpoint import MAX_BODY_BYTES, ControlEndpoint, new_token, request
from liver.policy.events import parse_action
from liver.policy.target import Hardware
from liver.engine.reference import ADAPTER
from liver.topology import JobConfig, ModelConfig, TrainConfig

JOB = JobConfig(model=ModelConfig(num_layers=4, hidden_size=64, num_heads=4, ffn_size=128, vocab_size=256,
                                  seq_len=16), train=TrainConfig(global_batch=8, micro_batch=2))
TOKEN = "fuzz-token"
ANSWERS = {200, 202, 400, 401, 404, 405, 411, 413, 414, 431, 501, 505}  # never 500: a bug of ours


class Job:
    """The controller's side of the endpoint, as the real one does it: parse, admit, queue."""

    def __init__(self) -> None:
        self.queue: list = []
        self.ended: int | None = None

    def submit(self, action: str) -> dict:
        ev = parse_action(action.strip(), "http")
        admit(ev, self.queue[-1].gpus if self.queue else 2, 4, ADAPTER, JOB, Hardware.named("h200"))
        self.queue.append(ev)
        return {"accepted": ev.describe(), "position": len(self.queue)}

    def withdraw(self, position: int) -> dict:
        self.queue = without(self.queue, position, 2, 4, ADAPTER, JOB, Hardware.named("h200"))
        return {"queued": len(self.queue)}

    def end(self, after: int) -> dict:
        if not 0 <= after <= 10**9:
            raise ValueError(f"after={after!r}: allowed 0 to 1000000000 steps")
        self.ended = after
        return {"ending": True}

    def status(self) -> dict:
        return {"phase": "stable", "queued": len(self.queue)}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    job = Job()
    ep = ControlEndpoint(job.submit, job.status, tmp_path_factory.mktemp("ep"), token=TOKEN,
                         queue=lambda: {"queued": [e.describe() for e in job.queue]}, withdraw=job.withdraw,
                         agents=lambda what, body: (_ for _ in ()).throw(ValueError(f"agent {what}: no agents here")),
                         metrics=lambda: ("text/plain; version=0.0.4", b"liver_up 1\n"), end=job.end)
    yield ep, job
    ep.close()


TEXT = st.text(string.printable.replace("\r", "").replace("\n", "").replace("\x0b", "").replace("\x0c", ""),
               max_size=60)
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                       lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4), max_leaves=12)
BODIES = st.one_of(
    st.binary(max_size=300),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"action": st.one_of(TEXT, st.sampled_from(
        ["scale-out 4", "scale-in 1", "reshape 1,2,1", "scale-in 1 deadline 30s", "scale-out 3 as 1,3,1",
         "scale-out 99", "reshape 3,1,1", "scale-in 0"]), JSONISH)}).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"position": JSONISH | st.integers(-3, 6)}).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"after": JSONISH | st.integers(-3, 10**10)}).map(lambda v: json.dumps(v).encode()),
)
PATHS = st.one_of(st.sampled_from(["/status", "/scale", "/queue", "/withdraw", "/end", "/metrics",
                                   "/agent/register", "/agent/sync", "/", "//scale", "/scale?x=1", "/status/",
                                   "/%00", "/" + "a" * 5000]),
                  TEXT.map(lambda t: "/" + "".join(c for c in t if c not in string.whitespace + "#")))
HEADERS = st.dictionaries(st.sampled_from(["Content-Type", "Content-Length", "Authorization", "Transfer-Encoding",
                                           "Expect", "X-Liver", "Connection"]), TEXT, max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW", "TRACE"]),
       path=PATHS, headers=HEADERS, body=BODIES, auth=st.sampled_from(["right", "wrong", "none", "random"]))
def test_any_request_gets_a_json_answer_and_changes_nothing_it_should_not(served, method, path, headers, body, auth):
    ep, job = served
    hdrs = dict(headers)
    if auth != "random":
        hdrs.pop("Authorization", None)
    if auth == "right":
        hdrs["Authorization"] = f"Bearer {TOKEN}"
    elif auth == "wrong":
        hdrs["Authorization"] = "Bearer not-it"
    length = hdrs.get("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) != len(body) and int(length) <= MAX_BODY_BYTES:
        del hdrs["Content-Length"]  # a shorter body than announced is a client that waits: not this test's subject
    if hdrs.get("Transfer-Encoding", "").strip().lower() == "chunked":
        del hdrs["Transfer-Encoding"]  # (a chunked body is not sent here: a client that waits)
    before = (len(job.queue), job.ended)
    host, port = ep.server.server_address[:2]
    c = http.client.HTTPConnection(host, port, timeout=20)
    try:
        c.putrequest(method, path, skip_accept_encoding=True)
        for k, v in hdrs.items():
            c.putheader(k, v)
        if "Content-Length" not in hdrs:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        code, data = r.status, r.read()
    finally:
        c.close()
    assert code in ANSWERS, (code, data)
    if method != "HEAD" and not (code == 200 and path == "/metrics"):
        answer = json.loads(data)
        assert isinstance(answer, dict) and (code < 400) == ("error" not in answer), answer
        if code >= 400:
            assert len(answer["error"]) < 600 and "Traceback" not in answer["error"]
    if code == 202:  # only a valid action, position or step count, with the token, is acted on
        assert auth == "right" and method == "POST" and path in ("/scale", "/withdraw", "/end"), (code, path)
    else:
        assert (len(job.queue), job.ended) == before, (code, path)
    assert request(ep.url, TOKEN, "GET", "/status")[0] == 200  # still serving
    if len(job.queue) > 3:
        job.queue.clear()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.one_of(st.binary(min_size=1, max_size=400),
                     st.tuples(st.sampled_from([b"GET", b"POST", b"BREW", b"", b"\x00"]), st.binary(max_size=40),
                               st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9.9", b"", b"SPDY"]),
                               st.binary(max_size=200)).map(lambda t: t[0] + b" /" + t[1] + b" " + t[2] + b"\r\n" + t[3])))
def test_bytes_that_are_no_request_get_a_json_refusal_or_a_closed_connection(served, raw):
    """Whatever arrives on the socket: a JSON answer (the HTTP layer's own refusals included), or
    the connection closed; the endpoint goes on serving and nothing is queued."""
    import socket

    ep, job = served
    before = (len(job.queue), job.ended)
    host, port = ep.server.server_address[:2]
    with socket.create_connection((host, port), timeout=20) as sock:
        sock.sendall(raw + b"\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    if data:
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 "), data[:200]
        code = int(head.split()[1])
        assert code in ANSWERS, data[:300]
        if b"Content-Type: application/json" in head and body:
            first = body[: int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])]
            assert isinstance(json.loads(first), dict)
        else:
            assert not body or code == 200, data[:300]  # (a GET /metrics of the bytes' making)
    assert (len(job.queue), job.ended) == before or b" 202 " in data[:20]
    assert request(ep.url, TOKEN, "GET", "/status")[0] == 200


def test_a_generated_token_is_one_argument_to_the_cli():
    """``liver status --token T`` with the endpoint's own token: a token beginning with "-" (one in
    64 from secrets.token_urlsafe) is taken for an option and refused."""
    import argparse

    cli = argparse.ArgumentParser(exit_on_error=False)
    cli.add_argument("--token")
    tokens = {new_token() for _ in range(2000)}
    assert len(tokens) == 2000 and all(cli.parse_args(["--token", t]).token == t for t in tokens)
