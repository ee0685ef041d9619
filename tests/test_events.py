"""Schedules, traces and target choice: pure metadata, checked in-process."""

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from liver.policy.events import EventError, parse_schedule, parse_trace
from liver.engine.reference import ADAPTER
from liver.policy.target import ACTIVATIONS, Hardware, candidates, choose, state_bytes
from liver.topology import JobConfig, ModelConfig, ParallelConfig, TrainConfig

TRACES = str(Path(__file__).resolve().parent.parent / "traces" / "bamboo")  # MIT, from the Bamboo project


def write(tmp_path, text):
    p = tmp_path / "ev.txt"
    p.write_text(text)
    return p


def test_schedule_grammar(tmp_path):
    evs = parse_schedule(write(tmp_path, "# c\n\nat step 4: scale-out 4\nat 2.5s: scale-in 2 deadline 30s as 1,2,1\n"
                                         "at step 9: reshape 1,2,2:3/1  # uneven\n"))
    assert [(e.kind, e.gpus, e.at_step, e.at_time) for e in evs] == \
        [("scale-out", 4, 4, None), ("scale-in", 2, None, 2.5), ("reshape", 4, 9, None)]
    assert evs[1].deadline_s == 30 and evs[1].parallel == ParallelConfig(pp=2)
    assert evs[2].parallel.layers_per_stage == (3, 1)


@pytest.mark.parametrize("text,needle", [
    ("at step x: scale-out 4", ":1: 'at step x: scale-out 4': expected"),
    ("at step 3: grow 4", ":1: action 'grow': allowed scale-out, scale-in, reshape"),
    ("\nat step 3: scale-out", ":2: scale-out needs the total GPU count"),
    ("at step 3: scale-out 4 as 1,1,2", "tp*pp*dp=2 but the event leaves 4 GPUs"),
    ("at step 3: scale-in 2 deadline soon", "deadline 'soon': allowed a positive duration"),
    ("at step 3: scale-out 2 deadline 3s", "option 'deadline' of scale-out: allowed 'as'"),
    ("at step 3: reshape 0,1,1", ":1: "),
    ("at step 3: reshape", "'reshape' takes one configuration"),
])
def test_schedule_refusals_name_file_line_and_problem(tmp_path, text, needle):
    p = write(tmp_path, text)
    with pytest.raises(EventError) as e:
        parse_schedule(p)
    assert str(p) in str(e.value) and needle in str(e.value)


def test_trace_mapping_and_refusals(tmp_path):
    evs = parse_trace(f"{TRACES}/p3-trace.csv", slots=4, compress=600)
    assert evs[0].kind == "start" and 1 <= evs[0].gpus <= 4
    n = evs[0].gpus
    for e in evs[1:]:
        assert 1 <= e.gpus <= 4 and e.gpus != n
        assert (e.kind == "scale-out") == (e.gpus > n)
        if e.kind == "scale-in":
            assert 0 <= e.deadline_s <= 120 / 600 + 1e-9
        n = e.gpus
    times = [e.at_time for e in evs]
    assert times == sorted(times)
    for text, needle in [("0,add,n1\n5,remove,n2\n", ":2: n2 removed but not up"),
                         ("0,add,n1\n0,add,n1\n", ":2: n1 added twice"),
                         ("0,add\n", ":1: '0,add': expected time_ms,add|remove,nodeNAME"),
                         ("10,add,n1\n5,add,n2\n", ":2: time 5 ms goes backwards")]:
        p = write(tmp_path, text)
        with pytest.raises(EventError, match=needle):
            parse_trace(p, slots=4, compress=1)


def test_trace_edge_cases_found_by_hand(tmp_path):
    """Lines at the same millisecond (2023 ms: no float rounding), every node leaving at once, a
    trace with no node ever up, UTF-16 and binary files."""
    evs = parse_trace(write(tmp_path, "0,add,a\n0,add,b\n2023,remove,a\n2023,add,c\n5000,remove,b\n5000,remove,c\n"),
                      slots=2, compress=1, notice_s=1)
    # all gone: a scale-in to 0 with its notice (the job waits with its state on disk)
    assert [(e.kind, e.gpus, e.deadline_s) for e in evs] == [("start", 2, None), ("scale-in", 0, 1.0)]
    with pytest.raises(EventError, match="ev.txt: no node is ever up"):
        parse_trace(write(tmp_path, "7,add,a\n7,remove,a\n"), slots=2, compress=1)
    p = tmp_path / "utf16.txt"
    p.write_text("at step 3: scale-out 4\n", encoding="utf-16")
    assert [e.gpus for e in parse_schedule(p)] == [4]
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff")
    with pytest.raises(EventError, match="utf16.txt: not a text events file"):
        parse_schedule(p)
    with pytest.raises(EventError, match="utf16.txt: not a text trace file"):
        parse_trace(p, slots=2, compress=1)
    with pytest.raises(EventError, match="--compress=nan"):
        parse_trace(p, slots=2, compress=float("nan"))
    with pytest.raises(EventError, match="expected 'at step N: ACTION'"):
        parse_schedule(write(tmp_path, "at step " + "9" * 5000 + ": scale-out 2\n"))


@settings(max_examples=150, deadline=None)
@given(data=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode),
                      st.lists(st.sampled_from(["at step 3: ", "at 2.5s: ", "scale-out 4", "scale-in 2 deadline 5s",
                                                "reshape 2,1,1", "as 1,1,2", "\n", "#", "0,add,a", "9,remove,a",
                                                "1,add,b", " ", "x", "-1", "99999999999"]), max_size=20)
                      .map(lambda xs: "".join(xs).encode())))
def test_schedule_and_trace_parsers_refuse_anything_else_with_an_event_error(tmp_path_factory, data):
    """Fuzzed: whatever the bytes, a parser gives events or an EventError naming the file."""
    p = tmp_path_factory.mktemp("fuzz") / "input.txt"
    p.write_bytes(data)
    for parse in (parse_schedule, lambda f: parse_trace(f, slots=4, compress=1)):
        try:
            parse(p)
        except EventError as e:
            assert "input.txt" in str(e) or "--" in str(e), e


JOB = JobConfig(model=ModelConfig(num_layers=4, hidden_size=64, num_heads=4, ffn_size=128, vocab_size=256,
                                  seq_len=32), train=TrainConfig(global_batch=8, micro_batch=1))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 16))
def test_target_choice_is_valid_and_best_by_its_own_estimate(gpus):
    cands = candidates(ADAPTER, JOB, gpus)
    if not cands:
        with pytest.raises(ValueError, match=f"gpus={gpus}"):
            choose(ADAPTER, JOB, gpus, Hardware.named("h200"))
        return
    c = choose(ADAPTER, JOB, gpus, Hardware.named("h200"))
    assert c.world_size == gpus
    ADAPTER.layout(JOB, c)


def test_target_choice_respects_memory():
    need = {c.parallel.short(): state_bytes(ADAPTER, JOB, c) * ACTIVATIONS for c in candidates(ADAPTER, JOB, 4)}
    limit = sorted(need.values())[0]
    c = choose(ADAPTER, JOB, 4, Hardware.named("h200", memory_bytes=limit))
    assert need[c.short()] <= limit
    with pytest.raises(ValueError, match="no configuration fits memory_bytes"):
        choose(ADAPTER, JOB, 4, Hardware.named("h200", memory_bytes=limit - 1))


def test_warm_mode_auto_resolves_by_backend_and_bad_values_are_refused():
    from liver.runtime.config import PrepareConfig
    assert PrepareConfig().connect_for("nccl") == "boundary"
    assert PrepareConfig().connect_for("gloo") == "background"
    assert PrepareConfig(connect="background").connect_for("nccl") == "background"
    with pytest.raises(ValueError, match="prepare.connect='soon'.*allowed 'auto'"):
        PrepareConfig(connect="soon")


def test_the_control_endpoint_refuses_hostile_requests_in_json(tmp_path):
    """What a new user (or a scanner) may send: oversized or nested bodies, huge counts and tokens,
    other methods; each gets one JSON error, and the endpoint keeps serving."""
    import http.client
    import json as _json

    from liver.controller.endpoint import ControlEndpoint, request
    from liver.policy.events import parse_action

    queued = []
    ep = ControlEndpoint(lambda a: queued.append(parse_action(a, "http")) or {"accepted": a}, lambda: {"ok": 1},
                         tmp_path, token="t")
    try:
        host, port = ep.server.server_address[:2]

        def raw(method, body=b"", headers=None):
            c = http.client.HTTPConnection(host, port, timeout=10)
            try:
                c.request(method, "/scale", body=body, headers={"Authorization": "Bearer t", **(headers or {})})
            except (BrokenPipeError, ConnectionResetError):
                pass  # answered and closed before the whole body was sent: the answer is there to read
            r = c.getresponse()
            out = (r.status, _json.loads(r.read() or b"{}"))
            c.close()
            return out

        assert raw("POST", b"[" * (1 << 20))[0] == 413  # over the body limit: not read
        assert raw("POST", b"[" * 60000)[0] == 400  # nested too deep for the parser: a plain refusal
        assert raw("POST", b"{}", {"Content-Length": "1000000000"})[0] == 413  # answered at once, not awaited
        # chunked: refused whole, the connection closed (its chunks are never read as requests)
        code, body = raw("POST", iter([b'{"action": ', b'"scale-out 4"}']), {"Transfer-Encoding": "chunked"})
        assert code == 411 and "Content-Length" in body["error"]
        code, body = raw("PUT", b"{}")
        assert code == 405 and "allowed GET /status" in body["error"]
        code, body = request(ep.url, "t", "POST", "/scale", {"action": "scale-out " + "9" * 5000})
        assert code == 400 and "integer from 1 to 999999" in body["error"] and len(body["error"]) < 300
        code, body = request(ep.url, "t", "POST", "/scale", {"action": "x" * (1 << 15)})
        assert code == 400 and len(body["error"]) < 300
        assert request(ep.url, "x" * (1 << 15), "GET", "/status")[0] == 401
        assert request(ep.url, "t", "GET", "/status") == (200, {"ok": 1})  # still serving
        assert queued == []
    finally:
        ep.close()


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(1, 6), min_size=1, max_size=6), now=st.integers(1, 6), data=st.data())
def test_withdrawing_a_queued_event_keeps_the_rest_valid_or_changes_nothing(counts, now, data):
    """Any queue of scale events, any position: either the rest of the queue is admitted again in
    order (and returned without it), or the withdrawal is refused naming the event it would break."""
    from liver.controller.admission import admit, without
    from liver.policy.events import Event

    queue, n = [], now
    for c in counts:  # a valid queue: each event changes the count from the one before it
        if c == n:
            continue
        queue.append(Event(kind="scale-out" if c > n else "scale-in", gpus=c, source=f"q{len(queue) + 1}"))
        n = c
    if not queue:
        return
    position = data.draw(st.integers(0, len(queue) + 1))
    before = list(queue)
    try:
        rest = without(queue, position, now, 8, ADAPTER, JOB, Hardware.named("h200"))
    except ValueError as e:
        assert "position=" in str(e) or "would leave" in str(e)
        assert queue == before  # nothing withdrawn
        return
    assert 1 <= position <= len(queue) and rest == before[:position - 1] + before[position:]
    n = now
    for ev in rest:  # what remains is admitted in order
        admit(ev, n, 8, ADAPTER, JOB, Hardware.named("h200"))
        n = ev.gpus


def test_the_endpoint_lists_and_withdraws_queued_events(tmp_path):
    from liver.controller.endpoint import ControlEndpoint, request

    queue = ["scale-out 4", "scale-in 2"]

    def withdraw(position):
        if not 1 <= position <= len(queue):
            raise ValueError(f"position={position}: allowed 1 to {len(queue)}")
        return {"withdrawn": queue.pop(position - 1)}

    ep = ControlEndpoint(lambda a: {}, lambda: {}, tmp_path, token="t", queue=lambda: {"queued": list(queue)},
                         withdraw=withdraw)
    try:
        assert request(ep.url, "t", "GET", "/queue") == (200, {"queued": ["scale-out 4", "scale-in 2"]})
        assert request(ep.url, "t", "POST", "/withdraw", {"position": 3})[0] == 400
        assert request(ep.url, "t", "POST", "/withdraw", {"position": "1"})[0] == 400
        assert request(ep.url, "t", "POST", "/withdraw", {"position": 2}) == (202, {"withdrawn": "scale-in 2"})
        assert request(ep.url, "t", "GET", "/queue") == (200, {"queued": ["scale-out 4"]})
    finally:
        ep.close()


def test_a_relative_step_trigger_counts_from_the_end_of_the_event_before_it():
    from liver.policy.events import parse_schedule_text
    evs = parse_schedule_text("at step 4: scale-out 4\nat step +6: scale-in 2 deadline 30s\n", "s")
    assert (evs[0].at_step, evs[0].after_previous) == (4, None)
    assert (evs[1].at_step, evs[1].after_previous, evs[1].deadline_s) == (None, 6, 30.0)
    assert evs[1].to_dict()["after_previous"] == 6
    with pytest.raises(EventError, match="at step \\+N: ACTION"):
        parse_schedule_text("at step +x: scale-out 4\n", "s")
