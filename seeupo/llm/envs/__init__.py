"""Environments of the agent loop, by name: what ``env.name`` of a train config may be.

One registry, :data:`ENVIRONMENTS`, lists them. A new environment is one decorated builder, in the
toolkit or in a plugin file (``seeupo train --plugin FILE``, :mod:`seeupo.plugins`)::

    @register_env("guess_number", options=GuessOptions, bounds={"high": (2, 1000)})
    def make_guess_number(opts: GuessOptions, tokenizer, seed: int) -> EnvSpec:
        ...

A builder takes the config's ``env.options`` read into its options dataclass (types, choices,
unknown keys and the ``bounds`` checked by :func:`seeupo.validation.schemas.dataclass_from_dict` before any
model loads; ``None`` when it registered none), the tokenizer and the run's seed, and returns an
:class:`EnvSpec`: the training tasks, how to make one environment per trajectory
(:class:`seeupo.llm.agent.Environment`), and what the environment adds to a run (a per-turn token
budget, exact metrics, a supervised warm-up, a set-up step). docs/new_environment.md writes one.

The built-ins (``bridge``, ``bfcl``, ``appworld``) are registered by name with their module first,
so that no plugin can take their names, and their module (with its dependencies) is imported when
one is first used: importing this package imports neither torch nor an environment.

A plugin's environment is checked where it enters (:func:`make_environment`): what its builder
returns, and what every environment it makes returns from ``reset``, ``step`` and ``truncate``
(initial messages of string roles and contents; a :class:`~seeupo.llm.agent.StepResult` whose
observation is a string or ``None``, reward a finite number, ``done`` a bool and ``info`` a dict),
and its ``metrics``, ``prepare`` and ``category``. A violation, or an exception of the plugin's own
code (other than an :class:`~seeupo.validation.errors.InputError`, which is one line already), is a :class:`~seeupo.core.boundary.PluginError`: one line naming the environment, the file
and line of its builder, what was expected and what came back (the command line exits with 2).
The model's text reaches an environment as a string and is never evaluated by the toolkit.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

from seeupo.core.registry import Entry, NameClash, Registry
from seeupo.validation.errors import InputError
from seeupo.validation.schemas import dataclass_from_dict

if TYPE_CHECKING:
    import torch

    from seeupo.llm.agent import Environment, StepResult

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class WarmUp:
    """A supervised warm-up of the fresh model before training, which :func:`seeupo.llm.trainer.warm_up` runs.

    The environment says what to learn; the trainer (or an experiment) runs the steps.

    examples: one batch of supervised examples, ``(contexts, responses)`` (token ids, one pair
      per row), drawn with the generator it is given; the warm-up raises the responses'
      log-likelihood given their contexts (e.g. the bridge's random valid answers, so that a
      random model answers in the format).
    steps, lr: the number of Adam steps (at least 1) and their learning rate.
    seed: seeds the one generator every batch is drawn with.
    metric: the name of the warm-up's final mean log-likelihood in the run's step-0 metrics
      (e.g. ``bridge/warmup_loglik``).
    target: an optional stopping rule ``(name, measure, threshold)``: ``measure(policy)`` is a
      number the warm-up should raise (the bridge: the exact probability of a valid first
      answer); it is measured before the first step and every ``check_every`` steps, the
      warm-up stops as soon as it is at least ``threshold``, and ``steps`` becomes a cap. The
      value reached is logged as ``name``. ``None``: exactly ``steps`` steps.
    check_every: steps between two measurements of ``target``.
    """

    examples: Callable[[torch.Generator], tuple[list[list[int]], list[list[int]]]]
    steps: int
    lr: float
    seed: int
    metric: str
    target: tuple[str, Callable[[Any], float], float] | None = None
    check_every: int = 5

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"a warm-up takes at least one step, not {self.steps} (no warm-up: no WarmUp)")
        if self.check_every < 1:
            raise ValueError(f"a warm-up measures its target every check_every >= 1 steps, not {self.check_every}")


@dataclass
class EnvSpec:
    """What a trainer needs from an environment.

    tasks: the training tasks (a step draws ``tasks_per_step`` of them, epoch by epoch).
    make: one environment for one trajectory; the generator is the step's source of randomness.
    max_new_tokens: a per-turn token budget the environment imposes (``None``: the config's).
    metrics: extra per-step metrics of the current policy (e.g. the bridge's exact ``J``).
    warm_up: a supervised warm-up of the fresh model before training (:class:`WarmUp`; e.g. the
      bridge's format warm-up); the trainer runs it.
    prepare: a set-up step before training that trains nothing (e.g. AppWorld's process prestart);
      it gets the fresh policy and returns metrics logged at step 0.
    eval_tasks: the tasks of ``seeupo eval`` (``None``: ``tasks``).
    category: the category of a task, for per-category evaluation tables (``None``: one category).

    An episode's success, for ``seeupo eval``, is ``info["success"]`` of its last turn when the
    environment reports one, and a positive return otherwise.
    """

    tasks: list[Any]
    make: Callable[[torch.Generator], Environment]
    max_new_tokens: int | None = None
    metrics: Callable[[Any], dict[str, float]] | None = None
    warm_up: WarmUp | None = None
    prepare: Callable[[Any], dict[str, float]] | None = None
    eval_tasks: list[Any] | None = None
    category: Callable[[Any], str] | None = None


@dataclass(frozen=True)
class EnvEntry(Entry):
    """A registered environment: its builder ``fn(options, tokenizer, seed) -> EnvSpec`` and its options.

    options: the dataclass ``env.options`` are read into (``None``: the environment takes no options,
      and ``env.options`` must be empty; the builder gets ``None``).
    bounds: inclusive ranges of the options' numeric fields, by field name.
    """

    options: type | None = None
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.options is not None and not (isinstance(self.options, type) and dataclasses.is_dataclass(self.options)):
            raise TypeError(f"environment {self.name!r}: options must be a dataclass (or None), got {self.options!r}")
        names = {f.name for f in dataclasses.fields(self.options)} if self.options is not None else set()
        unknown = sorted(set(self.bounds) - names)
        if unknown:
            raise TypeError(f"environment {self.name!r}: bounds name no field of its options: {unknown}")

    def read_options(self, options: Any) -> Any:
        """``env.options`` read into :attr:`options`, checked (:class:`~seeupo.validation.errors.InputError` naming the field)."""
        if self.options is None:
            if options:
                raise InputError("config.env.options", f"environment {self.name!r} takes no options, got {options!r}")
            return None
        return dataclass_from_dict(self.options, options, "config.env.options", dict(self.bounds))


class EnvRegistry(Registry[EnvEntry]):
    """The environments by name. A built-in is first registered as the name of its module
    (:meth:`declare`), which registers the entry itself with :func:`register_env` when it is imported,
    on the first :meth:`get`; every other name is registered once, as in every registry."""

    def __init__(self) -> None:
        super().__init__("environment", "env.name", EnvEntry)
        self._entries: dict[str, EnvEntry | str] = {}  # type: ignore[assignment]  # a str: a built-in's module

    def declare(self, name: str, module: str) -> None:
        """Register the built-in ``name``, defined in ``module`` (imported on first use)."""
        self._entries[name] = module

    def add(self, name: str, entry: EnvEntry) -> None:
        """Register ``entry`` under ``name``: a built-in's module filling its declared name, or a new name."""
        declared = self._entries.get(name)
        if isinstance(declared, str):
            if getattr(entry.fn, "__module__", None) != declared:
                raise NameClash(f"environment {name!r} is built in ({declared}); choose another name")
            self._entries[name] = entry
            return
        super().add(name, entry)

    def get(self, name: str) -> EnvEntry:
        """The entry ``name`` (a built-in's module imported first); an unknown name is a one-line
        :class:`~seeupo.validation.errors.InputError` listing the registered ones."""
        if not isinstance(name, str) or name not in self._entries:
            raise InputError("config.env.name", f"unknown environment {name!r}; expected one of {sorted(self.names())}")
        declared = self._entries[name]
        if isinstance(declared, str):
            importlib.import_module(declared)  # its @register_env replaces the module name with the entry
            if isinstance(self._entries[name], str):
                raise RuntimeError(f"{declared} does not register the built-in environment {name!r}")
        return self._entries[name]  # type: ignore[return-value]


ENVIRONMENTS = EnvRegistry()
ENVIRONMENTS.declare("bridge", "seeupo.llm.envs.bridge")
ENVIRONMENTS.declare("bfcl", "seeupo.llm.envs.bfcl")
ENVIRONMENTS.declare("appworld", "seeupo.llm.envs.appworld")


def register_env(name: str, *, options: type | None = None,
                 bounds: Mapping[str, tuple[float, float]] | None = None) -> Callable[[F], F]:
    """Register the decorated builder ``fn(options, tokenizer, seed) -> EnvSpec`` as the environment
    ``name`` (``env.name``); ``options``: the dataclass of its ``env.options``; ``bounds``: inclusive
    ranges of its numeric fields (see :class:`EnvEntry`). A name already registered is refused."""
    return ENVIRONMENTS.register(name, options=options, bounds=dict(bounds or {}))


def make_environment(name: str, options: dict[str, Any], tokenizer: Any, seed: int) -> EnvSpec:
    """The :class:`EnvSpec` of environment ``name`` for ``env.options`` ``options``; a plugin's is
    checked, and so is every environment and metric it makes (see the module docstring)."""
    entry = ENVIRONMENTS.get(name)
    opts = entry.read_options(options)
    if entry.builtin:
        return entry.fn(opts, tokenizer, seed)
    return _checked_spec(entry, _call(entry, "its builder", entry.fn, opts, tokenizer, seed))


# ---------------------------------------------------------------------------------------------- the boundary


def _checked_spec(entry: EnvEntry, spec: Any) -> EnvSpec:
    """``spec`` checked, with every callable of it wrapped so that what it returns is checked too."""
    if not isinstance(spec, EnvSpec):
        _fail(entry, "its builder", "an EnvSpec", spec)
    for what, tasks, optional in (("tasks", spec.tasks, False), ("eval_tasks", spec.eval_tasks, True)):
        if not (optional and tasks is None) and not (isinstance(tasks, list) and tasks):
            _fail(entry, "its builder", f"EnvSpec.{what} as a non-empty list" + (" or None" if optional else ""), tasks)
    if not callable(spec.make):
        _fail(entry, "its builder", "EnvSpec.make callable", spec.make)
    budget = spec.max_new_tokens
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        _fail(entry, "its builder", "EnvSpec.max_new_tokens a positive int or None", budget)
    for what in ("metrics", "prepare", "category"):
        if getattr(spec, what) is not None and not callable(getattr(spec, what)):
            _fail(entry, "its builder", f"EnvSpec.{what} callable or None", getattr(spec, what))
    if spec.warm_up is not None and not isinstance(spec.warm_up, WarmUp):
        _fail(entry, "its builder", "EnvSpec.warm_up a WarmUp or None", spec.warm_up)

    def checked(what: str, fn: Callable[..., Any] | None, check: Callable[[Any], Any]) -> Callable[..., Any] | None:
        return None if fn is None else lambda *args: check(_call(entry, what, fn, *args))

    def numbers(what: str) -> Callable[[Any], dict[str, float]]:
        def check(out: Any) -> dict[str, float]:
            if not (isinstance(out, dict) and all(isinstance(k, str) and _is_finite(v) for k, v in out.items())):
                _fail(entry, what, "a dict of metric names to finite numbers", out)
            return out
        return check

    def category(out: Any) -> str:
        if not isinstance(out, str):
            _fail(entry, "EnvSpec.category", "a category name (a str)", out)
        return out

    return dataclasses.replace(
        spec, make=lambda generator: _CheckedEnvironment(entry, _call(entry, "EnvSpec.make", spec.make, generator)),
        metrics=checked("EnvSpec.metrics", spec.metrics, numbers("EnvSpec.metrics")),
        prepare=checked("EnvSpec.prepare", spec.prepare, numbers("EnvSpec.prepare")),
        category=checked("EnvSpec.category", spec.category, category))


class _CheckedEnvironment:
    """A plugin's environment whose ``reset``, ``step`` and ``truncate`` are checked on every call;
    its other attributes are the environment's own."""

    def __init__(self, entry: EnvEntry, env: Any) -> None:
        for method in ("reset", "step"):
            if not callable(getattr(env, method, None)):
                _fail(entry, "EnvSpec.make", "an environment with reset(task) and step(text, token_ids)", env)
        gamma = getattr(env, "gamma", None)
        if gamma is not None and not (_is_finite(gamma) and 0.0 <= gamma <= 1.0):
            _fail(entry, "its environment's gamma", "a discount in [0, 1] or no gamma attribute", gamma)
        self._entry, self._env = entry, env

    def __getattr__(self, name: str) -> Any:  # called only for what this class lacks
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "truncate":  # optional: present exactly when the environment has it
            own = getattr(self._env, "truncate")
            return lambda outcome: self._result("truncate", _call(self._entry, "its environment's truncate", own, outcome),
                                                optional=True)
        return getattr(self._env, name)

    def reset(self, task: Any) -> list[dict[str, str]]:
        messages = _call(self._entry, "its environment's reset", self._env.reset, task)
        if not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):
            _fail(self._entry, "its environment's reset", 'a non-empty list of {"role": str, "content": str} messages',
                  messages)
        return messages

    def step(self, assistant_text: str, token_ids: list[int]) -> StepResult:
        out = _call(self._entry, "its environment's step", self._env.step, assistant_text, list(token_ids))
        return self._result("step", out)

    def _result(self, method: str, out: Any, optional: bool = False) -> StepResult | None:
        from seeupo.llm.agent import StepResult

        what = f"its environment's {method}"
        if out is None and optional:
            return None
        if not isinstance(out, StepResult):
            _fail(self._entry, what, "a StepResult" + (" or None" if optional else ""), out)
        if out.observation is not None and not isinstance(out.observation, str):
            _fail(self._entry, what, "an observation that is a str or None", out.observation)
        if not _is_finite(out.reward):
            _fail(self._entry, what, "a reward that is a finite number", out.reward)
        if not isinstance(out.done, bool):
            _fail(self._entry, what, "done as a bool", out.done)
        if not isinstance(out.info, dict):
            _fail(self._entry, what, "info as a dict", out.info)
        return out


def _is_finite(value: Any) -> bool:
    """A finite real number (an int or a float, not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _label(entry: EnvEntry, what: str) -> str:
    return f"environment {entry.name!r} ({entry.where}): {what}"


def _call(entry: EnvEntry, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; an exception of the plugin's code becomes one line naming the environment and the user's
    frames (an :class:`~seeupo.validation.errors.InputError` it raises, e.g. about an option, passes as it is)."""
    from seeupo.core.boundary import PluginError, user_frames

    try:
        return fn(*args)
    except InputError:  # already one line (PluginError is one): e.g. the builder refusing an option
        raise
    except Exception as err:
        at = user_frames(err, skip=1)
        text = " ".join(str(err).split())
        text = text if len(text) <= 300 else text[:297] + "..."
        raise PluginError(f"{_label(entry, what)} raised {type(err).__name__}: {text}" + (f" (at {at})" if at else "")) from None


def _fail(entry: EnvEntry, what: str, expected: str, got: Any) -> None:
    from seeupo.core.boundary import PluginError

    text = " ".join(repr(got).split())
    text = text if len(text) <= 80 else text[:77] + "..."
    raise PluginError(f"{_label(entry, what)} returned {type(got).__name__} {text}; expected {expected}")
