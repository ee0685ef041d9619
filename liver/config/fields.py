"""Typed conversion between the configuration dataclasses and plain data (TOML tables, the JSON a
worker process is started with): one place that knows how a field's type is checked, so every
config class only validates its own ranges in ``__post_init__``.

A value of the wrong type, or a key no field has, is refused with ``ValueError`` naming the field
(``transfer.budget_mib='big': expected an integer``), never a ``TypeError`` from a constructor.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Mapping, TypeVar

T = TypeVar("T")

_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for opt in options:
            if opt is type(None):
                continue
            try:
                return _convert(opt, value, where)
            except ValueError as e:  # (its own "where=value: " said once, in front)
                errors.append(str(e).removeprefix(f"{where}={value!r}: "))
        if all(e.startswith("expected ") for e in errors):
            raise ValueError(f"{where}={value!r}: expected {' or '.join(e.removeprefix('expected ') for e in errors)}")
        raise ValueError(f"{where}={value!r}: {'; '.join(errors)}")
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}={value!r}: expected a table")
        _, item = typing.get_args(tp)
        return {str(k): _convert(item, v, f"{where}.{k}") for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}={value!r}: expected a list")
        (item, _) = typing.get_args(tp)
        return tuple(_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, str) and hasattr(tp, "parse"):  # a short form ("1,2,1" for a ParallelConfig)
            return tp.parse(value)
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}={value!r}: expected a table of {tp.__name__} fields")
        return from_dict(tp, value, where)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in _NAMES:
        if isinstance(value, tp) and (tp is bool or not isinstance(value, bool)):
            return value
        raise ValueError(f"{where}={value!r}: expected {_NAMES[tp]}")
    if tp is Any:
        return value
    raise TypeError(f"{where}: field type {tp!r} has no conversion")  # a config class's own mistake


@functools.cache
def _fields(cls: type) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A class's resolved field types and init field names (resolving is slow: once per class)."""
    return typing.get_type_hints(cls), tuple(f.name for f in dataclasses.fields(cls) if f.init)


def from_dict(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """``cls(**data)`` with every field's type checked and nested tables converted; ``where`` is the
    section's name in messages (``"transfer"``)."""
    hints, names = _fields(cls)
    if not isinstance(data, Mapping):
        raise ValueError(f"{where or cls.__name__}={data!r:.80}: expected a table of {', '.join(names)}")
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ValueError(f"{_join(where, unknown[0])}: no such field; allowed: {', '.join(names)}")
    missing = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{_join(where, missing[0])}: missing; required: {', '.join(missing)}")
    return cls(**{k: _convert(hints[k], v, _join(where, k)) for k, v in data.items()})


def convert(tp: Any, value: Any, where: str) -> Any:
    """``value`` as a ``tp`` (a dataclass from its table, or one already made), checked as
    ``from_dict`` checks a field; ``where`` names it in messages."""
    return _convert(tp, value, where)


def with_model(job: Any, cls: type) -> Any:
    """A ``JobConfig`` whose model (its table, or one made) is a ``cls``: the configuration class
    its engine declares (``EngineAdapter.model_config``)."""
    model = convert(cls, job.model, "job.model")
    return job if model is job.model else dataclasses.replace(job, model=model)


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain data (tuples as lists) that ``from_dict`` reads back to an equal object."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v
    return plain(obj)


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Tables merged key by key (``over`` wins); other values replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out
