"""Logging as users of this field expect it: one line per training step (the worker's, see
``runtime.member.step_line``) and one structured line per reconfiguration phase, through the
standard ``logging`` module under the ``liver`` logger (``liver.controller`` for phases)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

PHASES = logging.getLogger("liver.controller")


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


def phase(what: str, **fields: Any) -> None:
    """One reconfiguration phase event with its fields (generation, durations, ...)."""
    PHASES.info(what, extra={"fields": fields})
