"""Named jobs as TOML files (``configs/*.toml``), overridden field by field from the command line.

A job file's top-level keys and tables are ``RunConfig``'s fields::

    preset = "tiny"           # the model and training options start from this named job (the
                              # model's only for engines whose model is the presets' ModelConfig)
    gpus = 2
    [job.model]               # any field of the engine's model configuration (ModelConfig's
                              # for the reference engine and recipes that take it)
    num_layers = 8
    [transfer]
    budget_mib = 256

An override is ``section.field=value`` (``--set job.model.num_layers=8``), its value read as a TOML
value (a bare word that is not one is a string: ``--set parallel=1,2,1``). Layering, last wins:
the dataclasses' defaults, the preset's job, the file, the overrides. Paths in the file (``events.
schedule``, ``events.trace``, an ``engine`` given as ``file.py:NAME``) are relative to the file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Mapping

from liver.config import RunConfig
from liver.config.fields import from_dict, merge, to_dict
from liver.engine.interface import DEFAULT_ENGINE, absolute_engine_path, load_adapter
from liver.topology import ModelConfig
from liver.topology.presets import PRESETS


def read(path: str | Path) -> dict[str, Any]:
    """The file's tables, its relative paths made absolute; ValueError naming the file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"--config {path}: no such job file") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"--config {path}: not a TOML job file: {e}") from None
    engine = data.get("engine")
    if isinstance(engine, str) and engine.partition(":")[0].endswith(".py"):  # a recipe's file
        module, _, attr = engine.partition(":")
        data["engine"] = f"{(p.parent / module).resolve()}:{attr}"
    events = data.get("events")
    if isinstance(events, dict):
        for key in ("schedule", "trace"):
            if isinstance(events.get(key), str):
                events[key] = str((p.parent / events[key]).resolve())
    return data


def override(text: str) -> dict[str, Any]:
    """``a.b.c=value`` as the nested table ``{"a": {"b": {"c": value}}}``."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ValueError(f"--set {text!r}: expected section.field=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return nested(key, value)


def nested(key: str, value: Any) -> dict[str, Any]:
    """``nested("a.b", 1) == {"a": {"b": 1}}``."""
    *head, last = key.split(".")
    out: dict[str, Any] = {last: value}
    for part in reversed(head):
        out = {part: out}
    return out


def build(*layers: Mapping[str, Any]) -> RunConfig:
    """A RunConfig from tables layered in order (a file's, then overrides); the preset named by
    the last layer that names one gives the job's base."""
    data: dict[str, Any] = {}
    for layer in layers:
        data = merge(data, layer)
    name = data.get("preset", "tiny")
    if name not in PRESETS:
        raise ValueError(f"preset={name!r}: allowed {', '.join(map(repr, PRESETS))}")
    job = data.get("job", {})
    if not isinstance(job, Mapping):
        raise ValueError(f"job={job!r}: expected a table")
    base = to_dict(PRESETS[name])
    if not _presets_model(data.get("engine", DEFAULT_ENGINE)):
        base["model"] = {}  # (a model of its own configuration: the preset's training options only)
    data["job"] = merge(base, job)
    return from_dict(RunConfig, data, "")


def _presets_model(engine: Any) -> bool:
    """Whether the engine's model configuration is the presets' (``ModelConfig``): its model table
    then starts from the preset's. (An engine that cannot be loaded is refused by ``RunConfig``.)"""
    try:
        return load_adapter(absolute_engine_path(engine)).model_config is ModelConfig
    except (ValueError, TypeError):
        return True


def load(path: str | Path | None, overrides: list[Mapping[str, Any]] = ()) -> RunConfig:
    return build(read(path) if path is not None else {}, *overrides)
