"""One validation layer for everything a user hands to ``seeupo``: files, fields and flags.

Every check here raises :class:`InputError`, whose ``str`` is one line naming the file (when
there is one), the field or flag, and the problem. The command line prints it as
``seeupo CMD: error: FILE: field 'X': PROBLEM`` and exits with code 2. Anything else that goes
wrong is a bug of the toolkit and keeps its traceback.

Limits (why: a hostile or mistaken file must fail fast, not hang or exhaust memory)

* :data:`MAX_FILE_BYTES` (64 MiB): larger JSON files are refused before they are read
  (``seeupo exact --max-cells`` raises it in proportion).
* :data:`MAX_DEPTH` (64): deeper JSON nesting is refused before parsing (Python's parser
  would otherwise recurse; numpy arrays have at most 64 dimensions anyway).
* :data:`MAX_INT_DIGITS` (30): longer integer literals are refused while parsing.
* ``NaN``, ``Infinity`` and float literals that overflow (``1e999``) parse to non-finite
  floats, which every typed reader below refuses, naming the field.
* Files must be UTF-8 (a byte-order mark is accepted).

This module imports neither torch nor numpy at import time, so ``seeupo --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterator, Literal

MAX_FILE_BYTES = 64 * 2**20
MAX_DEPTH = 64
MAX_INT_DIGITS = 30


class InputError(ValueError):
    """Bad user input; ``str(err)`` is one line: ``[SOURCE: ]field 'FIELD': MESSAGE``.

    ``source`` is the file (or ``None``); ``field`` the field or flag at fault (or ``None``
    when the problem is the file as a whole).
    """

    def __init__(self, field: str | None, message: str, source: str | None = None) -> None:
        self.field, self.message, self.source = field, message, source
        super().__init__(self._text())

    def _text(self) -> str:
        text = self.message if self.field is None else f"field '{self.field}': {self.message}"
        return text if self.source is None else f"{self.source}: {text}"

    def in_file(self, source: str | Path) -> "InputError":
        """This error attributed to ``source`` (unless it already names a file)."""
        if self.source is None:
            self.source = str(source)
            self.args = (self._text(),)
        return self

    def from_source(self, source: str) -> "InputError":
        """This error attributed to ``source`` instead of the file it named (a ``--set`` flag)."""
        self.source = source
        self.args = (self._text(),)
        return self

    def inside(self, prefix: str) -> "InputError":
        """This error with its field prefixed by an enclosing field: ``instance.rewards``."""
        self.field = prefix if self.field is None else f"{prefix}.{self.field}"
        self.args = (self._text(),)
        return self


# --------------------------------------------------------------------------- JSON files

_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')


def json_depth(data: bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON text (brackets inside strings ignored)."""
    import numpy as np

    code = np.frombuffer(_STRING.sub(b'""', data), dtype=np.uint8)
    opening = (code == ord("[")) | (code == ord("{"))
    brackets = opening[opening | (code == ord("]")) | (code == ord("}"))]  # one byte per character, then brackets only
    if brackets.size == 0:
        return 0
    return int(np.cumsum(np.where(brackets, 1, -1).astype(np.int32)).max(initial=0))


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise InputError(None, f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def parse_json(data: bytes, source: str) -> Any:
    """Decode UTF-8 JSON ``data`` with the limits of this module; errors name ``source``."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(None, f"not UTF-8 text (byte {err.start}); JSON files must be UTF-8", source) from None
    depth = json_depth(data)
    if depth > MAX_DEPTH:
        raise InputError(None, f"JSON nested {depth} deep (at most {MAX_DEPTH})", source)
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as err:
        raise InputError(None, f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})", source) from None
    except InputError as err:
        raise err.in_file(source) from None


def read_bytes(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; errors name the file."""
    path = Path(path)
    try:
        if not path.is_file():
            raise InputError(None, "cannot read (no such file)" if not path.exists() else "cannot read (not a regular file)", str(path))
        size = path.stat().st_size
        if size > max_bytes:
            raise InputError(None, f"{size} bytes, more than the limit of {max_bytes}", str(path))
        with path.open("rb") as f:
            return f.read(max_bytes + 1)
    except OSError as err:
        raise InputError(None, f"cannot read ({err.strerror})", str(path)) from None


def read_text(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A UTF-8 text file (a byte-order mark is accepted) of at most ``max_bytes``."""
    try:
        return read_bytes(path, max_bytes).decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(None, f"not UTF-8 text (byte {err.start}); files must be UTF-8", str(path)) from None


def read_json(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Read and parse a JSON file, refusing non-regular files and files over ``max_bytes``."""
    return parse_json(read_bytes(path, max_bytes), str(path))


def table_cells(num_initial_states: int, actions: tuple[int, ...], observations: tuple[int, ...] | None = None) -> int:
    """Entries of an instance's per-turn tables, ``sum_t N_t * A_t * O_t`` with ``N_t`` the
    histories of turn ``t`` (the size of an instance file, computed from its shape alone)."""
    obs = observations or (1,) * len(actions)
    n, total = num_initial_states, 0
    for a, o in zip(actions, obs):
        total += n * a * o
        n *= a * o
    return total


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that refuses NaN and infinities (strict JSON output)."""
    return json.dumps(value, allow_nan=False, **kwargs)


# --------------------------------------------------------------------------- typed fields



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


# --------------------------------------------------------------------------- flags (argparse types)


def _flag_type(name: str, check: Any) -> Any:
    def parse(text: str) -> Any:
        try:
            return check(text)
        except (ValueError, OverflowError) as err:
            raise argparse.ArgumentTypeError(f"{err}, got {text!r}") from None

    parse.__name__ = name
    return parse


def _int_in(low: int, high: int | None = None) -> Any:
    def check(text: str) -> int:
        value = int(text) if re.fullmatch(r"[+-]?\d{1,30}", text.strip()) else None
        if value is None or value < low or (high is not None and value > high):
            raise ValueError(f"must be an integer {'>= ' + str(low) if high is None else f'in [{low}, {high}]'}")
        return value

    return check


def _float_in(low: float, high: float, *, open_low: bool = False) -> Any:
    def check(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < low or value > high or (open_low and value == low):
            interval = f"{'(' if open_low else '['}{low:g}, {high:g}]"
            raise ValueError(f"must be a number in {interval}")
        return value

    return check


def _path(text: str) -> str:
    if not text.strip():  # Path("") is the current folder: an empty flag would write into it
        raise ValueError("expected a path")
    return text


path_arg = _flag_type("path", _path)
positive_int = _flag_type("positive_int", _int_in(1))
seed_int = _flag_type("seed", _int_in(0, 2**63 - 1))
probability = _flag_type("probability", _float_in(0.0, 1.0))
nonnegative_float = _flag_type("nonnegative_float", _float_in(0.0, math.inf))
positive_float = _flag_type("positive_float", _float_in(0.0, math.inf, open_low=True))


def int_range(low: int, high: int) -> Any:
    """An argparse type: an integer in ``[low, high]``."""
    return _flag_type(f"int in [{low}, {high}]", _int_in(low, high))


def comma_list(allowed: tuple[str, ...] | None) -> Any:
    """An argparse type: a non-empty comma-separated subset of ``allowed`` (``None``: any non-empty names,
    checked later, e.g. against registries that plugins fill after the arguments are parsed)."""

    def check(text: str) -> tuple[str, ...]:
        items = tuple(x.strip() for x in text.split(","))
        if allowed is None:
            if any(not x for x in items):
                raise ValueError("must be a comma-separated list of names")
            return tuple(dict.fromkeys(items))
        if not text.strip() or any(x not in allowed for x in items):
            raise ValueError(f"must be a comma-separated list of {', '.join(allowed)}")
        return items

    return _flag_type("list", check)


# --------------------------------------------------------------------------- output paths


_CREATED_DIRS: list[Path] = []  # what writable_dir created in this command, outermost first


def writable_dir(path: str | Path, flag: str) -> Path:
    """Create the output folder ``path`` now (before any work) or fail naming ``flag``. The folders it
    creates are remembered, so that a command refused later leaves none of them behind empty
    (:func:`no_empty_dirs_left_on_refusal`)."""
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
    try:
        path.mkdir(parents=True, exist_ok=True)
        _CREATED_DIRS.extend(missing)
    except FileExistsError:
        raise InputError(None, f"argument {flag}: {path} exists and is not a folder") from None
    except OSError as err:
        raise InputError(None, f"argument {flag}: cannot create the folder {path} ({err.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(None, f"argument {flag}: the folder {path} is not writable")
    return path


@contextlib.contextmanager
def no_empty_dirs_left_on_refusal() -> Iterator[None]:
    """A command inside it that is refused (:class:`InputError`) removes the folders
    :func:`writable_dir` created for it that are still empty, innermost first: a refused command
    leaves nothing behind."""
    _CREATED_DIRS.clear()
    try:
        yield
    except InputError:
        for path in reversed(_CREATED_DIRS):
            try:
                path.rmdir()  # only an empty folder
            except OSError:
                pass
        raise
    finally:
        _CREATED_DIRS.clear()


def writable_file(path: str | Path, flag: str) -> Path:
    """Check (before any work) that the file ``path`` can be written: its folder exists and is writable."""
    path = Path(path)
    parent = path.parent
    if path.is_dir():
        raise InputError(None, f"argument {flag}: {path} is a folder, expected a file name")
    if not parent.is_dir():
        raise InputError(None, f"argument {flag}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(None, f"argument {flag}: {path} is not writable")
    return path
