"""An event's outcome (liver/policy/outcome.py): a value every reader compares; the sentence
beside it is for people."""

import json
from pathlib import Path

from liver.policy.outcome import DROPPED_SAYS, HEALED_SAYS, SETTLED, Outcome, outcome_of, settle

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
FINDINGS = ("non-finite-loss", "checkpoint-failed")


def test_a_record_says_its_outcome_and_its_sentence():
    rec = settle({"event": {"kind": "scale-out"}}, Outcome.CANCELLED, "cancelled: a joiner was lost")
    assert rec["outcome"] == "cancelled" and outcome_of(rec) is Outcome.CANCELLED
    assert outcome_of({**rec, "status": "done"}) is Outcome.CANCELLED  # the value wins over any sentence
    assert settle({}, Outcome.DONE) == {"outcome": "done", "status": "done"}
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
