"""Reading the files a user hands to ``seeupo`` (JSON and text), and writing JSON.

Limits (why: a hostile or mistaken file must fail fast, not hang or exhaust memory)

* :data:`MAX_FILE_BYTES` (64 MiB): larger JSON files are refused before they are read
  (``seeupo exact --max-cells`` raises it in proportion).
* :data:`MAX_DEPTH` (64): deeper JSON nesting is refused before parsing (Python's parser
  would otherwise recurse; numpy arrays have at most 64 dimensions anyway).
* :data:`MAX_INT_DIGITS` (30): longer integer literals are refused while parsing.
* ``NaN``, ``Infinity`` and float literals that overflow (``1e999``) parse to non-finite
  floats, which every typed reader of :mod:`seeupo.validation.schemas` refuses, naming the field.
* Files must be UTF-8 (a byte-order mark is accepted).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from seeupo.validation.errors import InputError

MAX_FILE_BYTES = 64 * 2**20
MAX_DEPTH = 64
MAX_INT_DIGITS = 30


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


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that refuses NaN and infinities (strict JSON output)."""
    return json.dumps(value, allow_nan=False, **kwargs)


# --------------------------------------------------------------------------- typed fields
