"""One `liver run`: check the whole schedule, run the controller, write the report and timeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from liver.controller import report as rep
from liver.controller.controller import CONTROLLERS, RunOptions
from liver.controller.events import Event
from liver.topology import JobConfig, Layout


def run_job(job: JobConfig, opts: RunOptions, events: list[Event], run_dir: Path, mode: str,
            meta: dict[str, Any] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    if mode not in CONTROLLERS:
        raise ValueError(f"mode={mode!r}: allowed {', '.join(CONTROLLERS)}")
    if opts.initial is not None:  # refused before anything starts, with the field that is wrong
        Layout(job.model, opts.initial, job.train)
    run_dir.mkdir(parents=True, exist_ok=True)
    ctl = CONTROLLERS[mode](job, opts, events, run_dir, log=log)
    n = opts.gpus  # the whole schedule is checked before anything starts
    for ev in events:
        ctl.validate(ev, n)
        n = ev.gpus
    result = ctl.run()
    report = rep.build(run_dir, result, {"params": job.model.num_params(), "backend": opts.backend,
                                         "slots": opts.slots, "job": job.to_dict(), **(meta or {})})
    (run_dir / "report.json").write_text(json.dumps(report, indent=1))
    rep.timeline(report, run_dir / "timeline.png")
    return report
