"""What every ``seeupo`` command shares: the parser, its one-line errors and the checks of names.

A command module parses its flags with these and reports bad input by raising :class:`UsageError`
(or any :class:`~seeupo.validation.errors.InputError`), which :func:`seeupo.cli.main` prints as one line
with exit code 2. Nothing here imports torch: ``seeupo --help`` builds every command's parser.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from seeupo.validation.errors import InputError

if TYPE_CHECKING:
    from seeupo.tabular.behaviour import Rollouts

PAPER_REPRO = Path("paper_repro")
CHECK_DIR = Path("results/check")  # seeupo check NAME writes to CHECK_DIR / NAME by default
MAX_CELLS = 10**6  # seeupo generate's default size limit (table entries), and verify's on histories and GRAE rows


class UsageError(InputError):
    """A user error reported as one line with exit code 2 (no file or field to name)."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


class Parser(argparse.ArgumentParser):
    """``argparse`` with one-line errors: ``seeupo CMD: error: MESSAGE`` and exit code 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def plugin_option(p: argparse.ArgumentParser) -> None:
    """``--plugin``, the same on every command that reads an algorithm (seeupo.plugins)."""
    p.add_argument("--plugin", action="append", default=[], metavar="PATH_OR_MODULE",
                   help="a .py file or module name to import first, so that the command may name the algorithms, "
                        "advantage estimators, policy losses and aggregations it registers (repeatable; for train "
                        "and eval it adds to the config's plugins:); installed packages' plugins (entry-point group "
                        "seeupo.plugins) are always loaded")


def rollout_options(p: argparse.ArgumentParser) -> None:
    """The flags that draw the exact runs' rows off policy, in the ecosystem's words (the same on every command
    that takes them): :class:`seeupo.tabular.behaviour.Rollouts`."""
    from seeupo.validation.arguments import int_range, nonnegative_float, open_unit_float, positive_float

    g = p.add_argument_group("rollouts", "where the exact runs' rows come from (default: the policy being updated); "
                                         "the algorithm's correction (e.g. correction: sequence_is) reweights them")
    g.add_argument("--staleness", type=int_range(0, 1000), default=0, metavar="K",
                   help="each update reads rows drawn by the policy K updates earlier (an asynchronous trainer's "
                        "off-policyness; default 0)")
    g.add_argument("--temperature", type=positive_float, default=1.0,
                   help="the inference engine samples at this temperature (default 1)")
    g.add_argument("--top-k", type=int_range(0, 10**6), default=0, metavar="K",
                   help="the engine keeps the K likeliest tokens (default 0: all)")
    g.add_argument("--top-p", type=open_unit_float, default=1.0, metavar="P",
                   help="the engine keeps the likeliest tokens whose mass reaches P (nucleus sampling; default 1: all)")
    g.add_argument("--kernel-noise", type=nonnegative_float, default=0.0, metavar="STD",
                   help="seeded Gaussian noise of this std on every log-probability the engine computes (kernels or "
                        "precision that differ from the trainer's; default 0)")


def rollouts_from(args: argparse.Namespace) -> "Rollouts":
    """The :class:`~seeupo.tabular.behaviour.Rollouts` of :func:`rollout_options`' flags (the noise seeded by ``--seed``;
    without noise the seed is 0, so that one setting compares equal whatever ``--seed`` says)."""
    from seeupo.tabular.behaviour import Rollouts, Sampler

    seed = (getattr(args, "seed", None) or 0) if args.kernel_noise > 0 else 0  # the seed draws the noise, nothing else
    return Rollouts(args.staleness, Sampler(args.temperature, args.top_k, args.top_p, args.kernel_noise, seed=seed))


def readable_dir(path: str, flag: str) -> Path:
    """``path`` as an existing folder, or a one-line error naming ``flag``."""
    folder = Path(path)
    if not folder.is_dir():
        raise UsageError(f"argument {flag}: {path} is not a folder")
    return folder


def require_algorithms(names: str | Sequence[str], flag: str, *, tabular: bool = True) -> None:
    """Refuse, as one line naming ``flag``, any of ``names`` that is not a registered algorithm (a preset,
    built in or registered by a ``--plugin``), and with ``tabular`` any whose advantage estimator the
    tabular engine cannot run (registered with ``tabular=False``). One name (a ``str``) is quoted as
    such in the error, a list as a list."""
    from seeupo.core.config import PRESETS

    listed = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in listed if n not in PRESETS]
    if unknown:
        what = f"algorithm {names!r}" if isinstance(names, str) else f"algorithms {unknown}"
        raise UsageError(f"argument {flag}: unknown {what}; choose from {sorted(PRESETS)} "
                         "(--plugin FILE adds the presets a plugin registers)")
    if tabular:
        from seeupo.core.registry import adv_estimator

        off = [n for n in listed if not adv_estimator(PRESETS[n].advantage).tabular]
        if off:
            raise UsageError(f"argument {flag}: {off} use an advantage estimator registered with tabular=False")


def check_exact_contract(names: Sequence[str], group_size: int) -> None:
    """Call each algorithm's estimator through exact mode's contract checks (seeupo.core.contract): a function
    that raises or breaks the boundary's checks is one line (PluginError) before any work starts."""
    from seeupo.core.config import PRESETS
    from seeupo.core.contract import exact_mode_refusal

    for name in names:
        exact_mode_refusal(PRESETS[name].replace(group_size=group_size))


def require_llm_extra() -> None:
    """Refuse, as one line, a language-model command where the ``llm`` extra (transformers) is not installed."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise InputError(None, "needs the language-model extra: pip install 'seeupo[llm]'") from None
