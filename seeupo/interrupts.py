"""Where Ctrl-C may not be raised: inside the import of a package whose C extension discards it,
and in worker processes, whose parent handles it.

torch's C extension imports numpy and discards an exception raised during that import, so a
``KeyboardInterrupt`` raised there leaves numpy half-initialised and the program running on with
it. Whoever handles SIGINT asks :func:`inside_fragile_import` first: the command line ends the
process at once there, and a run that keeps partial results (``seeupo check``) defers the
interrupt to its next checkpoint instead.
"""

from __future__ import annotations

import contextlib
import signal
from types import FrameType
from typing import Iterator

#: The packages whose C extensions discard an interrupt during their import (torch's imports numpy).
FRAGILE_IMPORTS = ("torch", "numpy")


def inside_fragile_import(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside the import of a package of :data:`FRAGILE_IMPORTS` (a frame of that
    package below Python's import machinery). Other imports take the interrupt as any code does, so that
    a command that keeps partial results (check, verify) keeps them when Ctrl-C lands on a lazy import."""
    fragile = False
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        fragile = fragile or name.split(".")[0] in FRAGILE_IMPORTS
        if fragile and frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False



@contextlib.contextmanager
def interrupts_held_for_new_processes() -> Iterator[None]:
    """Start worker processes inside this block: they begin with SIGINT ignored (an ignored signal
    stays ignored across spawn's exec, where a handler or a blocked mask does not), so a Ctrl-C sent
    to the whole process group while a worker is still importing cannot print that worker's
    traceback. The cost: this process ignores a Ctrl-C that lands in the milliseconds it takes to
    start a worker (press it again). The worker's initializer calls :func:`ignore_interrupts_in_worker`."""
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)


def ignore_interrupts_in_worker() -> None:
    """A worker's first act: Ctrl-C is its parent's to handle (the parent ends its workers and keeps
    what finished), so the worker goes on ignoring SIGINT, whatever started it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
