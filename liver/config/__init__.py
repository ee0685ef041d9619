"""A whole job's configuration: the components' own configs composed, checked as a whole
(``RunConfig``, in ``liver.config.run``); the typed conversion of config dataclasses from plain data
(``liver.config.fields``); named jobs as TOML files (``liver.config.jobfile``).

``RunConfig`` is loaded on first use: the job's configuration knows its engine, and so imports
torch; a node agent and the commands that only talk to a running job read ``liver.config.fields``
without it (an agent's start: about 1.5 s of CPU less).
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunConfig"]


def __getattr__(name: str) -> Any:
    if name == "RunConfig":
        from liver.config.run import RunConfig
        return RunConfig
    raise AttributeError(f"module 'liver.config' has no attribute {name!r}")
