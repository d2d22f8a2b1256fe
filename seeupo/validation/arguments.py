"""Command-line flags: argparse types with one-line errors, and output paths checked before any work."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import time
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterator

from seeupo.validation.errors import InputError

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
open_unit_float = _flag_type("open_unit_float", _float_in(0.0, 1.0, open_low=True))


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


# the folders writable_dir created inside the running no_empty_dirs_left_behind block, outermost first
# (None outside one): a context variable, so that each command (or thread) keeps its own list
_created_dirs: ContextVar[list[Path] | None] = ContextVar("created_dirs", default=None)


def writable_dir(path: str | Path, flag: str) -> Path:
    """Create the output folder ``path`` now (before any work) or fail naming ``flag``. The folders it
    creates are remembered, so that a command refused later leaves none of them behind empty
    (:func:`no_empty_dirs_left_behind`)."""
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
    try:
        path.mkdir(parents=True, exist_ok=True)
        created = _created_dirs.get()
        if created is not None:
            created.extend(missing)
    except FileExistsError:
        raise InputError(None, f"argument {flag}: {path} exists and is not a folder") from None
    except OSError as err:
        raise InputError(None, f"argument {flag}: cannot create the folder {path} ({err.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(None, f"argument {flag}: the folder {path} is not writable")
    return path


def move_earlier_outputs_aside(out: Path, outputs: tuple[str, ...], overwrite: bool, command: str,
                               say: Callable[[str], None]) -> list[str]:
    """Keep what an earlier run wrote in ``out``: returns the files moved (``previous-*/NAME``).

    A run never overwrites an earlier one's files (``outputs``, the names ``command`` writes).
    Where one exists the command is refused (one line naming ``--overwrite``) unless
    ``overwrite``; then they are moved into ``out/previous-<UTC time>/``, said before it happens,
    and nothing is deleted. Other files in ``out`` stay.
    """
    present = [name for name in outputs if (out / name).exists()]
    if not present:
        return []
    if not overwrite:
        raise InputError(None, f"argument --out: {out} holds an earlier {command}'s {present[0]}; choose another "
                               "folder or pass --overwrite (which moves its files into previous-<time>/, deleting nothing)")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder, k = out / f"previous-{stamp}", 1
    while folder.exists():
        folder, k = out / f"previous-{stamp}-{k}", k + 1
    moved = [f"{folder.name}/{name}" for name in present]
    say(f"--overwrite: moving the earlier {command}'s files aside, nothing deleted: {', '.join(moved)}")
    folder.mkdir()
    for name in present:
        (out / name).rename(folder / name)
    return moved


@contextlib.contextmanager
def no_empty_dirs_left_behind() -> Iterator[None]:
    """A command inside it that is refused (:class:`InputError`), interrupted or that fails removes the
    folders :func:`writable_dir` created for it that are still empty, innermost first: it leaves
    nothing behind, and what it wrote stays."""
    created: list[Path] = []
    token = _created_dirs.set(created)
    try:
        yield
    except BaseException:
        remove_empty_created_dirs()
        raise
    finally:
        _created_dirs.reset(token)


def remove_empty_created_dirs() -> None:
    """Remove the folders :func:`writable_dir` created in the running :func:`no_empty_dirs_left_behind` block that
    are still empty, innermost first (none outside such a block)."""
    for path in reversed(_created_dirs.get() or []):
        try:
            path.rmdir()  # only an empty folder
        except OSError:
            pass


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
