"""``liver bench soak``: a CPU job under a long random stream of events, checked for what the design
promises after every one of them.

A seeded driver acts on a running job the way its users and its machines do: scale-outs and
scale-ins (with a notice's deadline, from 50 ms to 30 s, or none), reshapes, named and chosen
targets, SIGKILL of any live process (a rank, a joiner while it prepares, a leaving one), a rank
that hangs (SIGSTOP, found by its heartbeat), a queued event withdrawn, a request that must be
refused. Most actions wait for the job to be stable again; some come at once on top of the one in
flight (a notice during a scale-out's Prepare, a kill during a switch). Timings are random too.

At the end, from the job's own report: every handoff and recovery kept the state digest (a
recovery's against the step it restored), every step from 1 to the last ran, each re-run once per
rollback that covered it, no healed fail-stop rolled back, no recovery lost more than the design
allows (the steps since the last whole checkpoint: two intervals, as the newest may still be being
written), and the job ended cleanly. The JSON summary has the events by kind and outcome, the lost
steps and the downtime distribution by kind.

Then, for a sample of its recoveries (a heal, a drop, a rollback to the checkpoint), a restart
replay: a ``--mode restart`` job from the soak's own checkpoint before the recovery, on the layout
the soak had then, changing to the recovery's layout at the step it restored through DCP; the steps
after it must equal the soak's own, bit for bit (loss, gradient norm, digest): a step re-run after
a recovery is the step a restart computes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from liver import logs
from liver.config.jobfile import build
from liver.policy import target
from liver.controller.endpoint import request
from liver.controller.job import run_job
from liver.policy.outcome import WITHOUT_CHECKPOINT, Outcome, outcome_of

ACTIONS = {  # action -> weight
    "scale-out": 4, "scale-in": 2, "notice": 4, "reshape": 3, "kill": 3, "hang": 1, "withdraw": 1, "bad": 1,
}
DEADLINES = (0.05, 0.5, 3.0, 30.0)
OVERLAP = 0.2  # the chance that the next action comes at once, on top of this one
log = logs.PHASES


def _read_json(f: Path, timeout_s: float = 30.0) -> Any:
    """A JSON file another thread may be writing (read again while it is empty or partial)."""
    end = time.time() + timeout_s
    while True:
        try:
            return json.loads(f.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            if time.time() > end:
                raise
            time.sleep(0.05)


class JobGone(RuntimeError):
    """The job's endpoint no longer answers."""


class Driver:
    def __init__(self, cfg, run_dir: Path, rng: random.Random, slots: int) -> None:
        self.cfg, self.run_dir, self.rng, self.slots = cfg, run_dir, rng, slots
        info = _read_json(run_dir / "control.json")
        self.url, self.token = info["url"], info["token"]
        self.log: list[dict[str, Any]] = []

    def status(self) -> dict[str, Any]:
        try:
            code, body = request(self.url, self.token, "GET", "/status")
        except OSError as e:  # the job ended (its endpoint with it): the caller sees the job's own error
            raise JobGone(str(e)) from None
        if code != 200:
            raise RuntimeError(f"GET /status answered {code}: {body}")
        return body

    def procs(self) -> list[dict[str, Any]]:
        try:
            return [p for p in json.loads((self.run_dir / "procs.json").read_text()) if p["alive"]]
        except (FileNotFoundError, json.JSONDecodeError):
            return []

    def _layout(self, n: int, but: tuple[int, int, int] | None = None) -> str | None:
        """A random valid configuration for n processes (other than ``but``), as ``tp,pp,dp``."""
        cands = [c for c in target.candidates(self.cfg.adapter, self.cfg.job, n) if (c.tp, c.pp, c.dp) != but]
        if not cands:
            return None
        c = self.rng.choice(cands)
        return f"{c.tp},{c.pp},{c.dp}"

    def _scale(self, action: str) -> dict[str, Any]:
        code, body = request(self.url, self.token, "POST", "/scale", {"action": action})
        return {"request": action, "http": code, "answer": body.get("error") or body.get("queued") or body}

    def act(self) -> dict[str, Any]:
        """One action, of a kind the job's state allows now, drawn by its weight."""
        s = self.status()
        end = time.time() + 120
        while s["parallel"] is None and time.time() < end:  # (between a recovery's stop and its start)
            time.sleep(0.1)
            s = self.status()
        p = s["parallel"]
        if p is None:
            return {"kind": "none", "skipped": "no generation running"}
        n, now = p["tp"] * p["pp"] * p["dp"], (p["tp"], p["pp"], p["dp"])
        rng = self.rng
        alive = self.procs()
        active = {q for node in s["nodes"] for _, q in node["ranks"]}
        # never the last rank of the job: with no survivor there is nothing to recover on
        killable = [q for q in alive if q["proc"] not in active or len(active) > 1]
        allowed = {"scale-out": n < self.slots, "scale-in": n > 1, "notice": n > 1,
                   "reshape": self._layout(n, now) is not None, "kill": bool(killable),
                   "hang": len(active) > 1, "withdraw": s["queued"] > 0, "bad": True}
        kinds = [k for k in ACTIONS if allowed[k]]
        kind = rng.choices(kinds, weights=[ACTIONS[k] for k in kinds])[0]
        out: dict[str, Any] = {"kind": kind, "gpus": n, "phase": s["phase"]}
        if kind == "scale-out":
            m = rng.randint(n + 1, self.slots)
            named = self._layout(m) if rng.random() < 0.3 else None
            return {**out, **self._scale(f"scale-out {m}" + (f" as {named}" if named else ""))}
        if kind in ("scale-in", "notice"):
            m = rng.randint(1, n - 1)
            named = self._layout(m) if rng.random() < 0.3 else None
            deadline = f" deadline {rng.choice(DEADLINES):g}s" if kind == "notice" else ""
            return {**out, **self._scale(f"scale-in {m}{deadline}" + (f" as {named}" if named else ""))}
        if kind == "reshape":
            return {**out, **self._scale(f"reshape {self._layout(n, now)}")}
        if kind in ("kill", "hang"):
            pick = killable if kind == "kill" else [q for q in alive if q["proc"] in active]
            v = rng.choice(pick)
            os.kill(v["pid"], signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            return {**out, "proc": v["proc"], "role": v.get("role")}
        if kind == "withdraw":
            code, body = request(self.url, self.token, "POST", "/withdraw", {"position": rng.randint(1, s["queued"])})
            return {**out, "http": code, "answer": body}
        bad = rng.choice([f"scale-out {self.slots + 5}", "reshape 3,1,1", "scale-out 0", "launch 2",
                          f"scale-in 1 deadline -{rng.randint(1, 9)}s"])  # refused with a reason, nothing changes
        res = self._scale(bad)
        after = self.status()
        return {**out, **res, "unchanged": res["http"] == 400 and after["queued"] <= s["queued"]}

    def settle(self, timeout_s: float) -> bool:
        """Until the job is stable with nothing queued (False at the timeout)."""
        end = time.time() + timeout_s
        while time.time() < end:
            s = self.status()
            if s["phase"] == "stable" and s["queued"] == 0:
                return True
            time.sleep(0.1)
        return False


def _quantiles(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    return {"n": len(xs), "min": xs[0], "median": statistics.median(xs), "p90": q[8], "max": xs[-1]}


def check(report: dict[str, Any], ckpt_every: int) -> dict[str, Any]:
    """What the design promises, from the job's report."""
    events, steps = report["events"], [s["step"] for s in report["steps"]]
    # steps the survivors of a heal had completed when their rank 0 was lost before logging them
    unlogged = {k for e in events for k in e.get("steps_unlogged", [])}
    handled = [e for e in events if "digest_after" in e or "digest_before" in e]
    mismatched = [i for i, e in enumerate(events) if e.get("digest_equal") is False]
    unknown = [i for i, e in enumerate(events) if e in handled and e.get("digest_equal") is None]
    fails = [e for e in events if e["event"]["kind"] == "fail-stop"]
    rollbacks = [e for e in events if outcome_of(e) is Outcome.RECOVERED]
    lost = sum(e.get("lost_steps") or 0 for e in events)
    rerun = len(steps) - len(set(steps))
    over = [i for i, e in enumerate(events) if (outcome_of(e) in WITHOUT_CHECKPOINT and (e.get("lost_steps") or 0) > 1)
            or (outcome_of(e) is Outcome.RECOVERED and e["lost_steps"] > 2 * ckpt_every)]
    return {
        "handoffs_and_recoveries": len(handled), "digest_equal": len(handled) - len(mismatched) - len(unknown),
        "digest_different": mismatched, "digest_unknown": unknown,
        "steps_continuous": bool(steps) and sorted(set(steps) | unlogged) == list(range(1, steps[-1] + 1)),
        "last_step": steps[-1] if steps else 0, "steps_rerun": rerun, "lost_steps": lost,
        "steps_trained_unlogged": sorted(unlogged),
        # a step runs again only after a rollback over it, once per rollback at most
        "reruns_within_rollbacks": all(n - 1 <= sum(e["restored_step"] < k <= e["failed_at_step"] for e in rollbacks)
                                       for k, n in Counter(steps).items() if n > 1),
        "fail_stops": len(fails), "rollbacks": len(rollbacks), "losses_beyond_design": over,
    }


RECOVERED = (Outcome.RECOVERED, Outcome.HEALED, Outcome.DROPPED)


def _replay_plan(rec: dict[str, Any], steps: list[dict[str, Any]], ckpt_dir: Path, k: int) -> dict[str, Any] | None:
    """How to replay recovery ``rec`` by restart: the soak's newest checkpoint at a step c at or
    before the one it restored (S) whose steps c+1..S all ran on the layout before the recovery
    (so loading c on it and training to S gives the state the recovery started from), and the
    soak's own steps after S on the recovery's generation (at most ``k``); None where there is no
    such checkpoint or nothing to compare."""
    s, old_gen = rec["restored_step"], rec.get("old_generation")
    after = [x for x in steps if x["generation"] == rec["generation"] and s < x["step"] <= s + k]
    if not after or old_gen is None:
        return None
    ran_old = {x["step"] for x in steps if x["generation"] == old_gen}
    for c in sorted((int(p.name[4:]) for p in ckpt_dir.glob("step*") if p.name[4:].isdigit()
                     and (p / ".metadata").exists() and int(p.name[4:]) <= s), reverse=True):
        if all(i in ran_old for i in range(c + 1, s + 1)):
            return {"checkpoint": str(ckpt_dir / f"step{c:08d}"), "from_step": c, "after": after}
    return None


def replay(rec: dict[str, Any], plan: dict[str, Any], slots: int, run_dir: Path) -> dict[str, Any]:
    """The restart replay of one recovery (``_replay_plan``): equal or not, and what was compared."""
    from liver.policy.events import parse_schedule_text
    from liver.topology import ParallelConfig

    old, new = ParallelConfig.from_short(rec["old"]), ParallelConfig.from_short(rec["new"])
    s, c = rec["restored_step"], plan["from_step"]
    last = plan["after"][-1]["step"]
    if c == s:  # the state it restored is that checkpoint's: the new layout from it directly
        first, events = new, []
    else:
        kind = "reshape" if new.world_size == old.world_size else \
            "scale-in" if new.world_size < old.world_size else "scale-out"
        action = f"reshape {new.spelt()}" if kind == "reshape" else f"{kind} {new.world_size} as {new.spelt()}"
        first, events = old, parse_schedule_text(f"at step {s}: {action}\n", "replay")
    cfg = build({"preset": "tiny", "gpus": first.world_size, "parallel": first.spelt(), "steps": last,
                 "digest": "step", "checkpoint": {"every": 0, "start_from": plan["checkpoint"]},
                 "agent": {"slots": slots, "quiet": True},
                 "controller": {"mode": "restart", "end_after_events": None}})
    rep = run_job(cfg, events, run_dir, {"bench": "soak-replay"})

    def row(x):
        return x["step"], x["loss"], x["grad_norm"], x["digest"]

    want = [row(x) for x in plan["after"]]
    got = [row(x) for x in rep["steps"] if x["step"] in {w[0] for w in want}][-len(want):]
    return {"outcome": outcome_of(rec).value, "status": rec["status"], "old": rec["old"], "new": rec["new"], "restored_step": s,
            "replayed_from_checkpoint": c, "steps_compared": len(want), "equal": got == want}


def replays(report: dict[str, Any], run_dir: Path, slots: int, sample: int, rng: random.Random,
            k: int = 3) -> list[dict[str, Any]]:
    """Restart replays of up to ``sample`` of the soak's recoveries (drawn by ``rng``)."""
    plans = [(r, p) for r in report["events"] if outcome_of(r) in RECOVERED and r.get("generation") is not None
             and r.get("restored_step") is not None
             and (p := _replay_plan(r, report["steps"], run_dir / "ckpt", k)) is not None]
    out = []
    for i, (rec, plan) in enumerate(rng.sample(plans, min(sample, len(plans)))):
        out.append(replay(rec, plan, slots, run_dir / f"replay{i}"))
    return out


def run(events: int = 100, seed: int = 1, slots: int = 4, ckpt_every: int = 5, run_dir: Path | None = None,
        settle_s: float = 240.0, replay_sample: int = 3) -> dict[str, Any]:
    if events < 1:
        raise ValueError(f"--events={events}: allowed a positive count")
    if not 2 <= slots <= 8:
        raise ValueError(f"--slots={slots}: allowed 2 to 8 processes on this machine")
    if isinstance(replay_sample, bool) or not isinstance(replay_sample, int) or replay_sample < 0:
        raise ValueError(f"--replays={replay_sample!r}: allowed 0 or more recoveries to replay")
    if ckpt_every < 1:
        raise ValueError(f"--ckpt-every={ckpt_every}: allowed a positive step count (recoveries need one)")
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix=f"liver-soak-{seed}-"))
    cfg = build({"preset": "tiny", "gpus": 2, "parallel": "1,1,2", "steps": 10**7, "digest": "step",
                 # every checkpoint kept: the restart replays start from the one before each recovery
                 "checkpoint": {"every": ckpt_every, "keep": 10**6}, "agent": {"slots": slots, "quiet": True},
                 "controller": {"mode": "live", "endpoint": True, "end_after_events": None, "hang_timeout_s": 5.0}})
    box: dict[str, Any] = {}
    t0 = time.time()
    def work() -> None:
        try:
            box["report"] = run_job(cfg, [], run_dir, {"bench": "soak", "seed": seed})
        except BaseException as e:  # the soak's finding: said below, with the driver's log
            box["error"] = e
            log.exception("the soak's job failed")

    job = threading.Thread(target=work, daemon=True)
    job.start()
    end = time.time() + 300
    while not (run_dir / "control.json").exists() or not (run_dir / "steps.jsonl").exists():
        if time.time() > end or not job.is_alive():
            raise RuntimeError(f"the soak's job did not start; see {run_dir}")
        time.sleep(0.05)
    rng = random.Random(seed)
    d = Driver(cfg, run_dir, rng, slots)
    stuck = 0
    try:
        for i in range(events):
            entry = {"i": i, "t": round(time.time() - t0, 3), **d.act()}
            d.log.append(entry)
            log.info(f"soak action {json.dumps(entry)}")
            if rng.random() >= OVERLAP:
                stuck += not d.settle(settle_s)
                time.sleep(rng.uniform(0.0, 2.0))
        d.settle(settle_s)
        request(d.url, d.token, "POST", "/end", {"after": 3})
    except JobGone:
        pass
    job.join(900)
    if "report" not in box:
        (run_dir / "driver.json").write_text(json.dumps(d.log, indent=1))
        raise RuntimeError(f"the soak's job failed ({box.get('error')!r}) after {len(d.log)} actions; "
                           f"see {run_dir} (driver.json: the actions)")
    rep = box["report"]
    evs = rep["events"]
    by_outcome = Counter(f"{e['event']['kind']}: {outcome_of(e).value}" for e in evs)
    downtime: dict[str, Any] = {}
    for kind in sorted({e["event"]["kind"] for e in evs}):
        downtime[kind] = _quantiles([e["downtime_s"] for e in evs if e["event"]["kind"] == kind and "downtime_s" in e])
    applied = Counter(x["kind"] for x in d.log if "skipped" not in x)
    checks = check(rep, ckpt_every)
    refused = all(x.get("unchanged") for x in d.log if x["kind"] == "bad" and "http" in x)
    replayed = replays(rep, run_dir, slots, replay_sample, random.Random(seed))
    ok = (rep["rc"] if "rc" in rep else 0) == 0 and not checks["digest_different"] and checks["steps_continuous"] \
        and checks["reruns_within_rollbacks"] and not checks["losses_beyond_design"] and refused \
        and all(r["equal"] for r in replayed)
    return {"ok": ok, "seed": seed, "events_asked": events, "actions": dict(applied),
            "actions_skipped": sum("skipped" in x for x in d.log), "not_settled": stuck,
            "bad_requests_refused_unchanged": refused,
            "wall_s": time.time() - t0, "events_by_outcome": dict(sorted(by_outcome.items())),
            "downtime_s": downtime, **checks, "restart_replays": replayed, "run_dir": str(run_dir), "driver": d.log}
