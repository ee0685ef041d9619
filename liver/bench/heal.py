"""``liver bench heal``: a data-parallel replica killed with SIGKILL mid-run, healed from the
survivor's memory against recovered from the periodic checkpoint, side by side in one run
(interleaved repeats, the same model, kill step and checkpoint interval).

Per run: the stall (the fail-stop record's downtime: from the end of the last step before the kill
to the end of the first step after it, less a normal step), the steps lost (re-run after a
rollback), the work they cost (lost steps x the median step) and the sum, the time a training run
loses to the failure. The kill lands a few steps after a checkpoint (``kill_after`` past a multiple
of ``ckpt_every``), where a rollback costs what it costs on average."""

from __future__ import annotations

import json
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from liver.config.jobfile import build
from liver.controller.job import run_job
from liver.policy.outcome import Outcome, outcome_of

MODEL = {"num_layers": 8, "hidden_size": 256, "num_heads": 8, "ffn_size": 1024, "vocab_size": 8192, "seq_len": 64}
"""About 13M parameters (with AdamW state, ~150 MiB of training state): the size torchft's figure
in the reliability issue was measured at (10M)."""


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    f = run_dir / "steps.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []


def job_config(steps: int, ckpt_every: int, gpus: int = 2, heal_timeout_s: float = 30.0):
    """The benchmark's job: ``MODEL``, data-parallel over ``gpus`` of 2 slots, live."""
    return build({"preset": "tiny", "gpus": gpus, "parallel": f"1,1,{gpus}", "steps": steps,
                  "job": {"model": MODEL, "train": {"global_batch": 8, "micro_batch": 2}},
                  "checkpoint": {"every": ckpt_every},
                  "agent": {"slots": 2, "quiet": True},
                  "controller": {"mode": "live", "endpoint": False, "end_after_events": None,
                                 "heal_timeout_s": heal_timeout_s}})


def _once(mode: str, run_dir: Path, kill_at: int, steps: int, ckpt_every: int) -> dict[str, Any]:
    cfg = job_config(steps, ckpt_every, heal_timeout_s=30.0 if mode == "heal" else 0.0)
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.update(report=run_job(cfg, [], run_dir, {"bench": mode})), daemon=True)
    t.start()
    end = time.time() + 600
    while not any(s["step"] >= kill_at for s in _steps(run_dir)):
        if time.time() > end or not t.is_alive():
            raise RuntimeError(f"{mode}: the job did not reach step {kill_at}; see {run_dir}")
        time.sleep(0.01)
    victim = next(p for p in json.loads((run_dir / "procs.json").read_text()) if p["proc"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    t.join(900)
    rep = box["report"]
    (rec,) = [e for e in rep["events"] if e["event"]["kind"] == "fail-stop"]
    if (outcome_of(rec) is Outcome.HEALED) != (mode == "heal"):
        raise RuntimeError(f"{mode}: the fail-stop was {rec['status']!r}; see {run_dir}")
    step_s = statistics.median(s["step_s"] for s in rep["steps"])
    stall = rec.get("downtime_s")
    lost = rec["lost_steps"]
    return {"mode": mode, "status": rec["status"], "failed_at_step": rec["failed_at_step"],
            "restored_step": rec["restored_step"], "stall_s": stall, "lost_steps": lost, "median_step_s": step_s,
            "lost_work_s": lost * step_s, "total_lost_s": (stall or 0.0) + lost * step_s,
            "digest_equal": rec.get("digest_equal"), "run_dir": str(run_dir)}


def run(repeats: int = 3, ckpt_every: int = 10, kill_after: int = 6, steps: int = 60,
        run_dir: Path | None = None) -> dict[str, Any]:
    if repeats < 1:
        raise ValueError(f"--repeats={repeats}: allowed a positive count")
    if not 0 < kill_after < ckpt_every:
        raise ValueError(f"--kill-after={kill_after}: allowed 1 to ckpt_every-1={ckpt_every - 1} steps past a checkpoint")
    base = run_dir or Path(tempfile.mkdtemp(prefix="liver-bench-heal-"))
    kill_at = 2 * ckpt_every + kill_after
    if steps <= kill_at + 5:
        raise ValueError(f"--steps={steps}: allowed more than {kill_at + 5} (the kill comes at step {kill_at})")
    runs = []
    for r in range(repeats):  # interleaved: both see the same machine state
        for mode in ("heal", "checkpoint"):
            runs.append(_once(mode, base / f"{mode}-{r}", kill_at, steps, ckpt_every))
    out: dict[str, Any] = {"params": (lambda c: c.adapter.facts(c.job).params)(build({"job": {"model": MODEL}})), "layout": "tp1pp1dp2",
                           "kill_at_step": kill_at, "ckpt_every": ckpt_every, "repeats": repeats, "runs": runs}
    for mode in ("heal", "checkpoint"):
        mine = [x for x in runs if x["mode"] == mode]
        out[mode] = {k: statistics.median(x[k] for x in mine if x[k] is not None)
                     for k in ("stall_s", "lost_steps", "lost_work_s", "total_lost_s")}
        out[mode]["stall_s_range"] = [min(x["stall_s"] for x in mine), max(x["stall_s"] for x in mine)]
    out["digests_equal"] = all(x["digest_equal"] is not False for x in runs)
    return out
