"""The agents' side of the control plane under random messages (hypothesis): ``register``,
``sync`` and ``wait`` bodies of any shape and value, as a buggy or stale agent (or anyone holding the token)
could send them, to a real controller in this process (``fake_job``). Each is answered (a reply, or
a ValueError naming the field: the endpoint's 400) and the controller's loop goes on; no message
can make the controller fail (the endpoint's own HTTP handling is fuzzed in test_endpoint_fuzz)."""

from __future__ import annotations

import json
import string

from hypothesis import HealthCheck, given, settings, strategies as st

from fake_job import controller

TEXT = st.text(string.printable, max_size=30)
ANY = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | TEXT,
                   lambda kids: st.lists(kids, max_size=3) | st.dictionaries(TEXT, kids, max_size=3), max_leaves=8)
INT = st.one_of(st.integers(-5, 12), st.integers(-2**70, 2**70), ANY)
NAME = st.one_of(st.sampled_from(["local", "node1", "node2", "", " ", "a/b", "x" * 300]), TEXT, ANY)
RUNNING = st.fixed_dictionaries({"proc": INT, "slot": INT, "role": st.sampled_from(["start", "joiner"]) | ANY,
                                 "generation": INT, "pid": INT})
EXITED = st.fixed_dictionaries({"proc": INT, "returncode": INT, "tail": TEXT | ANY})
NOTICE = st.fixed_dictionaries({"source": TEXT | ANY, "deadline_s": st.floats() | INT})
REGISTER = st.fixed_dictionaries({"node": NAME, "slots": INT}, optional={
    "host": TEXT | ANY, "pid": INT, "workers": st.lists(RUNNING, max_size=3) | ANY, "done": INT, "extra": ANY})
SYNC = st.fixed_dictionaries({"node": NAME}, optional={
    "done": INT, "started": st.lists(RUNNING, max_size=3) | ANY, "exited": st.lists(EXITED, max_size=3) | ANY,
    "notice": NOTICE | ANY})
WAIT = st.fixed_dictionaries({"node": NAME}, optional={"after": INT, "wait_s": st.floats() | INT, "extra": ANY})
MESSAGES = st.lists(st.tuples(st.just("register"), REGISTER) | st.tuples(st.just("sync"), SYNC) |
                    st.tuples(st.just("wait"), WAIT) |
                    st.tuples(st.sampled_from(["register", "sync", "wait"]), ANY), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=MESSAGES)
def test_any_agent_message_is_answered_or_refused_and_the_controller_goes_on(tmp_path_factory, messages):
    ctl, node, ranks = controller(tmp_path_factory.mktemp("fuzz"))  # (a wait is held 0.1 s at most: the interval)
    ranks.step(1)
    ctl.once()
    for what, body in messages:
        try:
            reply = ctl.membership.agent_request(what, body)
        except ValueError:
            continue  # (the endpoint's 400, naming the field)
        json.dumps(reply)  # (what goes back is plain data)
        ctl.once()
    ctl.once()
    for n in ctl.nodes.nodes.values():
        assert 1 <= n.slots <= 4096 and n.name
