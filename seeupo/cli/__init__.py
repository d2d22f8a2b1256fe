"""The ``seeupo`` command line.

    seeupo verify [--quick] ...            regenerate the paper's Table 1 from measurements
    seeupo exact INSTANCE.json [--policy]  exact J, J* (and with --tables the per-history tables) of an instance file
    seeupo generate ...                    write a random instance file
    seeupo claims [IDS] [--quick]          check every claim of the paper and the toolkit, with evidence
    seeupo replay FILE... [--explain]      recompute counterexample (or gradient case) files, fail if they do not reproduce; why J fell
    seeupo search [NAMES]                  search for counterexamples (hypothesis) and save them
    seeupo check NAME [--plugin FILE]      one algorithm end to end: verify cells, searches, a bridge run; a report
    seeupo train [CONFIG] [--resume]       train a language model on a multi-turn environment (also under torchrun)
    seeupo eval [CONFIG] [--checkpoint]    avg@k and pass@k of a checkpoint on the evaluation tasks
    seeupo figures [NAMES] [--quick]       regenerate the figures (figures/NAME.png and its data, NAME.json)
    seeupo presets [NAME] [--all]          the algorithm presets: how they differ, or one preset's settings

Each command is one module of this package (:data:`COMMANDS`), with ``add_parser(subparsers)`` and
``run(args) -> int``: it parses and validates its flags, calls the library and prints. What they
share (the parser, :class:`~seeupo.cli.common.UsageError`, ``--plugin``, the checks of algorithm
names) is :mod:`seeupo.cli.common`. Building the parser imports neither torch nor hypothesis, so
``seeupo --help`` is fast; a command imports what it needs when it runs.

Bad input (a malformed file, an out-of-range flag, an unwritable ``--out``) gives one line on
stderr, ``seeupo CMD: error: [FILE: ]field 'X': PROBLEM`` or ``seeupo CMD: error: argument
--FLAG: PROBLEM``, and exit code 2, before any work starts. Errors of the toolkit itself keep
their traceback. Files are read through :mod:`seeupo.validation` (size, nesting and number
limits) and :mod:`seeupo.tabular.instances` (format and size limits).

Size limits (raise them explicitly with ``--max-cells``):

* ``seeupo generate`` refuses instances of more than :data:`~seeupo.cli.common.MAX_CELLS` table
  entries (10**6, about 20 MB of JSON) unless ``--max-cells`` is larger.
* ``seeupo exact`` refuses instances of more than ``seeupo.tabular.instances.MAX_CELLS``
  (10**7) entries, and files over 64 MiB, unless ``--max-cells`` is larger.

``seeupo replay`` reports every file, and exits with 2 if any file was bad input, else 1 if any
recorded run did not reproduce, else 0.

``seeupo check`` exits with 1 when it measured nothing (``no learning signal``, or a ``vacuous``
bridge), with 128 + the signal's number when Ctrl-C or SIGTERM stopped it (the partial report is
written), else 0 (``J decreased`` is a finding, not a failure). ``seeupo verify`` and ``seeupo
search`` exit with 130 when Ctrl-C stopped them, after writing what finished; ``seeupo eval``
too, saying how to resume. Ctrl-C anywhere else (while a command imports torch, say) is one line,
``seeupo CMD: interrupted``, and exit code 130, not a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn

from seeupo.cli.common import Parser
from seeupo.interrupts import inside_fragile_import
from seeupo.validation.arguments import no_empty_dirs_left_behind, remove_empty_created_dirs
from seeupo.validation.errors import InputError

COMMANDS: dict[str, str] = {
    "verify": "seeupo.cli.verify",
    "exact": "seeupo.cli.exact",
    "generate": "seeupo.cli.generate",
    "claims": "seeupo.cli.claims",
    "replay": "seeupo.cli.replay",
    "search": "seeupo.cli.search",
    "check": "seeupo.cli.check",
    "scorecard": "seeupo.cli.scorecard",
    "train": "seeupo.cli.train",
    "eval": "seeupo.cli.eval",
    "figures": "seeupo.cli.figures",
    "presets": "seeupo.cli.presets",
}
"""Every command: its name and the module that defines it, in the order ``seeupo --help`` lists them."""

# commands that load --plugin with the run config (which records them) instead of before they run
_PLUGINS_WITH_CONFIG = ("train", "eval")

INTERRUPTED = 130  # 128 + SIGINT, as the shell reports a process that Ctrl-C stopped


def build_parser() -> argparse.ArgumentParser:
    """The ``seeupo`` parser: one subcommand per entry of :data:`COMMANDS`, each running its module's ``run``."""
    parser = Parser(prog="seeupo", description="SeeUPO verification toolkit.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_parser(sub)
        sub.choices[name].set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command (``argv``: the arguments after ``seeupo``; default ``sys.argv[1:]``) and return its
    exit status: 2 with one line on stderr for bad input (:class:`~seeupo.validation.errors.InputError`), 130 with
    ``seeupo CMD: interrupted`` for a Ctrl-C the command does not handle itself. ``--help`` and flags
    argparse refuses exit through ``SystemExit``, as argparse does."""
    args = None
    try:
        args = build_parser().parse_args(argv)
        with _interrupts_reported(args.command):
            return _run(args)
    except KeyboardInterrupt:  # one line, not a traceback
        command = getattr(args, "command", None)
        print(f"seeupo{' ' + command if command else ''}: interrupted", file=sys.stderr)
        return INTERRUPTED


@contextlib.contextmanager
def _interrupts_reported(command: str) -> Iterator[None]:
    """Ctrl-C while ``command`` runs: a ``KeyboardInterrupt`` as with Python's own handler (the commands that
    keep partial results catch it, and :func:`main` reports the rest), except while a module is being
    imported. There the process ends at once with ``seeupo CMD: interrupted`` and status 130: an import
    cut short leaves its module half-initialised, and some never let the interrupt through (torch's C
    extension imports numpy and discards the error, so the command would run on with a broken numpy).
    Installed only in the main thread of this process (a forked worker keeps Python's behaviour);
    the handler before it is restored on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()

    def interrupted(signum: int, frame: FrameType | None) -> None:
        if os.getpid() == pid and inside_fragile_import(frame):
            sys.stdout.flush()
            print(f"seeupo {command}: interrupted", file=sys.stderr, flush=True)
            remove_empty_created_dirs()  # os._exit runs no cleanup: an output folder made for nothing goes now
            os._exit(INTERRUPTED)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run(args: argparse.Namespace) -> int:
    """Load the plugins ``args`` names and run its command; bad input is one line and exit status 2."""
    try:
        if hasattr(args, "plugin"):  # installed packages' plugins first, then the command line's
            from seeupo.plugins import entry_point_plugins, load_plugins

            args.plugin = [*entry_point_plugins(), *args.plugin]
            args.plugins_loaded = () if args.command in _PLUGINS_WITH_CONFIG else load_plugins(args.plugin, "--plugin")
        if getattr(args, "no_progress", False):  # Hugging Face's own bars too (transformers reads this on import)
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        with no_empty_dirs_left_behind():
            return args.func(args)
    except InputError as err:  # bad files, fields and flags (InstanceError is one); anything else is a bug
        print(f"seeupo {args.command}: error: {err}", file=sys.stderr)
        return 2


def console() -> NoReturn:
    """The ``seeupo`` executable: ``main`` with the process-level settings a command line wants."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `seeupo ... | head` ends quietly
    try:
        status = main()
    except KeyboardInterrupt:  # a second Ctrl-C while the first was being reported
        status = INTERRUPTED
    distributed = sys.modules.get("seeupo.llm.distributed")  # imported only where a process group may be joined
    if distributed is not None and distributed.joined_process_group():
        distributed.exit_skipping_teardown(status)
    sys.exit(status)
