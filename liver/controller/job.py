"""One `liver run`: check the whole job, run the controller, write the report (and its timeline)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from liver.config import RunConfig
from liver.controller import report as rep
from liver.controller.admission import check_schedule
from liver.controller.controller import Controller
from liver.policy.events import Event


def run_job(cfg: RunConfig, events: list[Event], run_dir: Path, meta: dict[str, Any] | None = None,
            token: str | None = None, local_node: bool = True, resume: dict[str, Any] | None = None) -> dict[str, Any]:
    """``cfg`` with its slots set. Everything is checked before any process starts.
    ``local_node``: the workers run from an agent in this process (else: on the ``liver agent``
    nodes that register with the controller's endpoint); ``resume``: the journal of a controller
    that died, to go on from."""
    check_schedule(cfg, events)
    run_dir.mkdir(parents=True, exist_ok=True)
    ctl = Controller(cfg, events, run_dir, token=token, local_node=local_node, resume=resume)
    result = ctl.run()
    report = rep.build(run_dir, result, {"params": cfg.adapter.facts(cfg.job).params, "backend": cfg.backend,
                                         "interrupted": result["interrupted"],
                                         "slots": cfg.slots, "job": cfg.job.to_dict(), **(meta or {})})
    (run_dir / "report.json").write_text(json.dumps(report, indent=1))
    if cfg.timeline:
        try:
            rep.timeline(report, run_dir / "timeline.png")
        except ModuleNotFoundError as e:  # (matplotlib is an extra: the job and its report stand without it)
            report["timeline_not_drawn"] = f"{e.name} is not installed (pip install 'liver[plot]')"
    return report
