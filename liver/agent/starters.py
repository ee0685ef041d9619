"""A way of making worker processes, as plain data the controller sends an agent (in its
``Registered`` answer: the agent learns how, never what for) and the ``Starter`` it stands for:

- ``{"kind": "forked", "preload": ..., "entry": ..., "args": [...], "joiners": bool}``: forked from
  the agent's zygote (``liver.agent.zygote.ForkedWorkers``);
- ``{"kind": "fresh", "module": ...}``: fresh interpreters (``liver.agent.interpreter``).
"""

from __future__ import annotations

from typing import Any

from liver.agent.node import Starter

KINDS = ("forked", "fresh")


def forked(preload: str, entry: str, args: tuple[str, ...], joiners: bool,
           start_timeout_s: float = 120.0) -> dict[str, Any]:
    """``start_timeout_s``: a fork the template has not made by then fails its start (a joiner's
    handoff is then cancelled; the job trains on)."""
    return {"kind": "forked", "preload": preload, "entry": entry, "args": list(args), "joiners": joiners,
            "start_timeout_s": start_timeout_s}


def fresh(module: str) -> dict[str, Any]:
    return {"kind": "fresh", "module": module}


def make(spec: dict[str, Any]) -> Starter:
    kind = spec.get("kind")
    if kind == "forked":
        from liver.agent.zygote import ForkedWorkers
        return ForkedWorkers(spec["preload"], spec["entry"], tuple(spec["args"]), joiners=spec["joiners"],
                             start_timeout_s=float(spec.get("start_timeout_s", 120.0)))
    if kind == "fresh":
        from liver.agent.interpreter import FreshInterpreters
        return FreshInterpreters(spec["module"])
    raise ValueError(f"starter.kind={kind!r}: allowed {', '.join(KINDS)}")
