"""Environments of the agent loop, by name: what ``env.name`` of a train config may be.

Each builder takes the config's ``env.options``, the tokenizer and the run's seed and returns an
:class:`EnvSpec`: the training tasks, how to make one environment per trajectory, and what the
environment adds to a run (a per-turn token budget, exact metrics, a supervised warm-up, a set-up
step).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from seeupo.llm.agent import Environment
from seeupo.validation import InputError

# name -> "module:builder"; builders take (options, tokenizer, seed) and return an EnvSpec
ENVIRONMENTS: dict[str, str] = {
    "bridge": "seeupo.llm.envs.bridge:make_bridge",
    "bfcl": "seeupo.llm.envs.bfcl:make_bfcl",
    "appworld": "seeupo.llm.envs.appworld:make_appworld",
}


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


def make_environment(name: str, options: dict[str, Any], tokenizer: Any, seed: int) -> EnvSpec:
    """The :class:`EnvSpec` of environment ``name`` (a key of :data:`ENVIRONMENTS`)."""
    if name not in ENVIRONMENTS:
        raise InputError("config.env.name", f"unknown environment {name!r}; expected one of {sorted(ENVIRONMENTS)}")
    module, builder = ENVIRONMENTS[name].split(":")
    return getattr(importlib.import_module(module), builder)(dict(options), tokenizer, seed)
