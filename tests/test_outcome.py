"""An event's outcome (liver/policy/outcome.py): a value every reader compares; the sentence
beside it is for people."""

import json
from pathlib import Path

from liver.policy.outcome import DROPPED_SAYS, HEALED_SAYS, SETTLED, Outcome, outcome_of

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
FINDINGS = ("non-finite-loss", "checkpoint-failed")


def test_a_record_says_its_outcome_and_its_sentence():
    """In the controller a record's outcome is the enum; the report's form (and a journal written
    before records were typed) carries its value beside the sentence."""
    import pytest

    from liver.controller.records import EventRecord
    rec = EventRecord.of({"kind": "scale-out"}, Outcome.STARTED, gpus=2)
    assert rec.settle(Outcome.CANCELLED, "cancelled: a joiner was lost") is rec and rec.outcome is Outcome.CANCELLED
    d = rec.to_dict()
    assert d == {"event": {"kind": "scale-out"}, "outcome": "cancelled", "status": "cancelled: a joiner was lost",
                 "gpus": 2}
    assert outcome_of(d) is Outcome.CANCELLED and outcome_of({**d, "status": "done"}) is Outcome.CANCELLED
    assert EventRecord.from_dict(d) == rec and EventRecord.from_dict(d).to_dict() == d
    assert EventRecord.of({}, Outcome.DONE).to_dict() == {"event": {}, "outcome": "done", "status": "done"}
    with pytest.raises(KeyError, match="settle"):
        rec["outcome"] = "done"  # (what happened is a value, set by settle)
    assert {o for o in Outcome if o in SETTLED} == {Outcome.DONE, Outcome.RECOVERED, Outcome.HEALED, Outcome.DROPPED}


def test_records_written_before_outcomes_are_read_from_their_sentence():
    """Every event of every report committed under bench/results gets an outcome of its own (the
    simulator's calibration and the README's figures read them)."""
    assert outcome_of({"status": HEALED_SAYS}) is Outcome.HEALED
    assert outcome_of({"status": DROPPED_SAYS}) is Outcome.DROPPED
    assert outcome_of({"status": "recovered: the leaving processes were stopped before"}) is Outcome.RECOVERED
    seen = set()
    for f in sorted(RESULTS.rglob("*.json")):
        data = json.loads(f.read_text())
        events = data.get("events") if isinstance(data, dict) else None
        for e in events if isinstance(events, list) else []:
            if not isinstance(e, dict) or "status" not in e or not isinstance(e.get("event"), dict):
                continue
            out = outcome_of(e)
            seen.add(out)
            assert out is not Outcome.REPORTED or e["event"].get("kind") in FINDINGS, (f, e["status"])
    assert Outcome.DONE in seen
    replays = [r for f in RESULTS.glob("cpu-soak*/*.json") for d in [json.loads(f.read_text())]
               for row in (d if isinstance(d, list) else [d]) if isinstance(row, dict)
               for r in row.get("restart_replays") or []]
    assert replays and {outcome_of(r) for r in replays} <= {Outcome.HEALED, Outcome.RECOVERED, Outcome.DROPPED}
