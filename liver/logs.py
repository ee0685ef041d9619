"""Logging as users of this field expect it: one line per training step (the worker's, see
``runtime.courier.step_line``) and one structured line per reconfiguration phase, through the
standard ``logging`` module under the ``liver`` logger (``liver.controller`` for phases)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

PHASES = logging.getLogger("liver.controller")
STEPS = logging.getLogger("liver.steps")
STEP_FORMAT = "[liver] %(asctime)s %(message)s"  # a worker's step lines: with the time, as torchtitan's


class _Fields(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        if fields is None:
            return f"[liver] {record.getMessage()}"
        return "[liver] " + json.dumps({"phase": record.getMessage(), **fields})


def setup(level: int = logging.INFO) -> None:
    """The command line's handler: phase events and messages to stdout, one line each."""
    root = logging.getLogger("liver")
    if not any(getattr(h, "_liver", False) for h in root.handlers):
        h = logging.StreamHandler(sys.stdout)
        h.setFormatter(_Fields())
        h._liver = True  # type: ignore[attr-defined]
        root.addHandler(h)
    root.setLevel(level)
    root.propagate = False


def setup_steps() -> None:
    """A worker's handler: its step lines to stdout, each with its time."""
    if not any(getattr(h, "_liver", False) for h in STEPS.handlers):
        h = logging.StreamHandler(sys.stdout)
        h.setFormatter(logging.Formatter(STEP_FORMAT))
        h._liver = True  # type: ignore[attr-defined]
        STEPS.addHandler(h)
    STEPS.setLevel(logging.INFO)
    STEPS.propagate = False


def is_step_line(line: str) -> bool:
    """A worker's step line (``setup_steps``), which a process's last words are not."""
    return line.startswith(("step:", "[rank")) or (line.startswith("[liver] ") and " step: " in line[:60])


def phase(what: str, **fields: Any) -> None:
    """One reconfiguration phase event with its fields (generation, durations, ...)."""
    PHASES.info(what, extra={"fields": fields})


def culprit(err: BaseException) -> str:
    """An exception in one line, for a user: its type, its message and the line of the user's own
    code it came from (the innermost frame outside liver, torch and the standard library), e.g.
    ``ValueError: bad head count (at /home/me/recipe.py:42: raise ValueError(...))``."""
    import os
    import traceback

    here = os.path.dirname(os.path.abspath(__file__))
    library = {os.path.dirname(os.__file__)}  # the standard library (site-packages is below it)
    frames = traceback.extract_tb(err.__traceback__)
    mine = [f for f in frames if not f.filename.startswith(here) and
            not any(f.filename.startswith(d) for d in library) and "site-packages" not in f.filename]
    where = mine[-1] if mine else (frames[-1] if frames else None)
    text = f"{type(err).__name__}: {err}"
    if where is not None:
        text += f" (at {where.filename}:{where.lineno}" + (f": {where.line}" if where.line else "") + ")"
    return text
