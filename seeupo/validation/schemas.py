"""Typed fields read from parsed data: numbers in ranges, strings from choices, known keys, dataclasses.

Each reader raises :class:`~seeupo.validation.errors.InputError` naming the field (``instance.rewards``).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from seeupo.validation.errors import InputError

def table_cells(num_initial_states: int, actions: tuple[int, ...], observations: tuple[int, ...] | None = None) -> int:
    """Entries of an instance's per-turn tables, ``sum_t N_t * A_t * O_t`` with ``N_t`` the
    histories of turn ``t`` (the size of an instance file, computed from its shape alone)."""
    obs = observations or (1,) * len(actions)
    n, total = num_initial_states, 0
    for a, o in zip(actions, obs):
        total += n * a * o
        n *= a * o
    return total


def type_name(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def as_object(value: Any, field: str | None) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an error naming ``field``."""
    if not isinstance(value, dict):
        raise InputError(field, f"must be an object, got {type_name(value)}")
    return value


def check_keys(data: dict[str, Any], required: set[str], optional: set[str] = frozenset(), where: str | None = None) -> None:
    """Every key of ``required`` present, and no key outside ``required | optional``."""
    for key in sorted(required - set(data)):
        raise InputError(key if where is None else f"{where}.{key}", "missing")
    for key in sorted(set(data) - required - set(optional)):
        raise InputError(key if where is None else f"{where}.{key}", f"unknown field; expected {sorted(required | set(optional))}")


def is_int(value: Any) -> bool:
    """A JSON integer (``True`` is an int in Python but not here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite JSON number (not a boolean, not a string)."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def int_field(value: Any, field: str, low: int, high: int) -> int:
    """An integer in ``[low, high]``."""
    if not is_int(value):
        raise InputError(field, f"must be an integer, got {type_name(value)}")
    if not low <= value <= high:
        raise InputError(field, f"must be in [{low}, {high}], got {value}")
    return value


def float_field(value: Any, field: str, low: float = -math.inf, high: float = math.inf) -> float:
    """A finite number in ``[low, high]``."""
    if not is_number(value):
        raise InputError(field, f"must be a finite number, got {type_name(value)}")
    if not low <= value <= high:
        raise InputError(field, f"must be in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def str_field(value: Any, field: str, choices: tuple[str, ...] | None = None) -> str:
    """A string, one of ``choices`` when given."""
    if not isinstance(value, str):
        raise InputError(field, f"must be a string, got {type_name(value)}")
    if choices is not None and value not in choices:
        raise InputError(field, f"unknown value {value!r}; expected one of {list(choices)}")
    return value


def _typed(value: Any, hint: Any, field: str, bounds: dict[str, tuple[float, float]]) -> Any:
    """``value`` checked against the type hint ``hint`` (the types dataclass configs use)."""
    origin, params = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return dataclass_from_dict(hint, value, field, bounds)
    if origin is dict:
        items = as_object(value, field)
        if len(items) > 1000:
            raise InputError(field, "more than 1000 entries")
        return {str_field(k, field): _typed(v, params[1], f"{field}.{k}", bounds) for k, v in items.items()}
    if origin is Literal:
        return str_field(value, field, tuple(params))
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in params:
            return None
        inner = [p for p in params if p is not type(None)]
        if len(inner) == 1:
            return _typed(value, inner[0], field, bounds)
        for option in inner:  # e.g. bool | Literal["auto"]: the first type that takes the value
            try:
                return _typed(value, option, field, bounds)
            except InputError:
                pass
        raise InputError(field, f"must be {' or '.join(map(_described, inner))}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, list):
            raise InputError(field, f"must be a list, got {type_name(value)}")
        items = params[:1] * len(value) if len(params) == 2 and params[1] is Ellipsis else params
        if len(items) != len(value):
            raise InputError(field, f"must have {len(items)} entries, got {len(value)}")
        if len(value) > 1000:
            raise InputError(field, "more than 1000 entries")
        return tuple(_typed(v, t, f"{field}[{i}]", {}) for i, (v, t) in enumerate(zip(value, items)))
    low, high = bounds.get(field.rsplit(".", 1)[-1], (-math.inf, math.inf))
    if hint is bool:
        if not isinstance(value, bool):
            raise InputError(field, f"must be true or false, got {type_name(value)}")
        return value
    if hint is int:
        return int_field(value, field, int(max(low, -(2**63))), int(min(high, 2**63 - 1)))
    if hint is float:
        return float_field(value, field, low, high)
    if hint is str:
        return str_field(value, field)
    raise TypeError(f"no validator for type {hint!r} of field {field}")  # a toolkit bug, not an input error


def _described(hint: Any) -> str:
    """A type hint as an error message names it: ``true or false``, ``'auto'``, ``a number``."""
    if hint is bool:
        return "true or false"
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(v) for v in typing.get_args(hint))
    return {int: "an integer", float: "a number", str: "a string"}.get(hint, getattr(hint, "__name__", str(hint)))


def dataclass_from_dict(cls: type, data: Any, where: str, bounds: dict[str, tuple[float, float]] | None = None) -> Any:
    """Build the dataclass ``cls`` from a JSON object, every field type-checked.

    Unknown keys are errors; missing keys take the dataclass default. ``bounds`` maps field
    names to inclusive ``(low, high)`` ranges for numbers. A field whose metadata holds
    ``"choices"`` (a function returning the allowed strings now, e.g. a registry's names) is checked
    against them. The class's own validation
    (``__post_init__``) runs last; its ``ValueError`` becomes an :class:`InputError` naming ``where``.
    """
    data = as_object(data, where)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    check_keys(data, set(), set(fields), where)
    kwargs = {k: _typed(v, hints[k], f"{where}.{k}", bounds or {}) for k, v in data.items()}
    for k, v in kwargs.items():  # open choices (registries) name their allowed values in the field's metadata
        if "choices" in fields[k].metadata:
            str_field(v, f"{where}.{k}", fields[k].metadata["choices"]())
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise InputError(where, str(err)) from None
