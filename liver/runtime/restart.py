"""Stop-and-restart through DCP: the baseline every live reconfiguration is compared against.

Each segment is a set of fresh worker processes (``python -m liver.worker``): process start,
imports, group initialisation, DCP load with resharding, and the first (warm-up) step are all
paid for real, and each is measured.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


from liver.topology import JobConfig, ParallelConfig
from liver.world.world import make_store


class SegmentFailed(RuntimeError):
    pass


def run_processes(*, store_addr: str, namespace: str, job: JobConfig, parallel: ParallelConfig,
                  steps: int, workdir: Path, load_from: str | None = None,
                  save_to: str | None = None, backend: str = "gloo", log: bool = True,
                  digests: bool = True, timeout_s: float = 600.0) -> tuple[list[dict], dict]:
    """Start one process per rank, run a segment, wait for all; returns results and parent times."""
    workdir.mkdir(parents=True, exist_ok=True)
    procs, specs = [], []
    launch = time.time()
    for rank in range(parallel.world_size):
        spec = dict(store_addr=store_addr, namespace=namespace, rank=rank, job=job.to_dict(),
                    parallel=parallel.to_dict(), steps=steps, load_from=load_from,
                    save_to=save_to, backend=backend, log=log, digests=digests)
        path = workdir / f"{namespace}-rank{rank}.json"
        path.write_text(json.dumps(spec))
        env = dict(os.environ, LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "liver.worker", str(path)], env=env,
                                      stderr=subprocess.PIPE, text=True))
        specs.append(path)
    errors = []
    for rank, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SegmentFailed(f"segment {namespace}: rank {rank} did not finish in {timeout_s}s")
        if p.returncode != 0:
            errors.append(f"rank {rank} exited {p.returncode}:\n{err[-3000:]}")
    exited = time.time()
    if errors:
        raise SegmentFailed(f"segment {namespace} failed:\n" + "\n".join(errors))
    results = [json.loads(Path(str(s).replace(".json", ".out.json")).read_text()) for s in specs]
    return results, {"launch": launch, "exited": exited}


def restart_breakdown(old: list[dict], old_parent: dict, new: list[dict], new_parent: dict) -> dict[str, float]:
    """Downtime of one stop-and-restart, and its phases (DESIGN.md definitions)."""
    normal_step = statistics.median(s for r in new for s in r["step_s"][1:]) if len(new[0]["step_s"]) > 1 \
        else statistics.median(s for r in old for s in r["step_s"])
    last_old_step = max(r["wall"]["last_step_end"] for r in old)
    first_new_step = max(r["wall"]["first_step_end"] for r in new)
    # the digests taken after the old generation's last step and before the new one's first
    # are checks, not restart work: they are measured and left out
    digest_s = max(r["timings"].get("digest_start_s", 0.0) for r in new) + \
        max(r["timings"].get("digest_end_s", 0.0) for r in old)
    phases = {
        "save_s": max(r["timings"].get("save_s", 0.0) for r in old),
        "stop_s": old_parent["exited"] - max(r["wall"]["end"] for r in old),
        "process_start_s": max(r["wall"]["imported"] for r in new) - new_parent["launch"],
        "group_init_s": max(r["timings"]["group_init_s"] for r in new),
        "load_s": max(r["timings"].get("load_s", 0.0) + r["timings"]["build_s"] for r in new),
        "warmup_s": max(r["step_s"][0] for r in new) - normal_step,
    }
    phases["downtime_s"] = first_new_step - last_old_step - normal_step - digest_s
    phases["normal_step_s"] = normal_step
    return phases


def stop_and_restart(*, job: JobConfig, configs: list[ParallelConfig], steps: int, workdir: Path,
                     backend: str = "gloo", log: bool = True) -> dict[str, Any]:
    """Train ``steps`` steps in each configuration in turn, reshaping by stop-and-restart."""
    store, addr = make_store()
    events, prev, prev_parent, digests = [], None, None, []
    for i, pc in enumerate(configs):
        ck_in = str(workdir / f"ckpt{i - 1}") if i else None
        ck_out = str(workdir / f"ckpt{i}") if i + 1 < len(configs) else None
        if log:
            print(f"--- generation {i}: {pc.short()} ({pc.world_size} processes)"
                  + (f", restarting from {ck_in}" if ck_in else ""), flush=True)
        res, parent = run_processes(store_addr=addr, namespace=f"seg{i}", job=job, parallel=pc,
                                    steps=steps, workdir=workdir, load_from=ck_in, save_to=ck_out,
                                    backend=backend, log=log)
        digests.append({"start": res[0]["digest_start"], "end": res[0]["digest_end"]})
        if prev is not None:
            ev = restart_breakdown(prev, prev_parent, res, parent)
            ev.update(old=configs[i - 1].short(), new=pc.short(),
                      digest_equal=digests[-2]["end"] == digests[-1]["start"])
            events.append(ev)
        prev, prev_parent = res, parent
    return {"events": events, "digests": digests}
