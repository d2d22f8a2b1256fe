"""Guess the number: a language-model environment as a plugin (docs/new_environment.md).

The model guesses a hidden whole number between ``low`` and ``high``; after each wrong guess it
is told "higher" or "lower", and it has ``max_steps`` guesses. A correct guess ends the episode
with reward 1; an answer with no number in it ends it with reward 0; so does the last wrong guess.

    seeupo train examples/environments/guess_number.yaml --plugin examples/environments/guess_number.py
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from seeupo.llm.agent import StepResult
from seeupo.llm.envs import EnvSpec, register_env
from seeupo.validation.errors import InputError


@dataclass(frozen=True)
class GuessOptions:
    """``env.options`` of ``guess_number`` (checked before any model loads).

    low, high: the hidden number is drawn uniformly from ``low..high``.
    max_steps: guesses per episode (``rollout.max_turns`` must allow them).
    num_tasks: how many hidden numbers the training tasks hold (drawn with the run's seed).
    """

    low: int = 1
    high: int = 8
    max_steps: int = 3
    num_tasks: int = 16


class GuessNumber:
    """One episode: the hidden number is the task; the state is the number of guesses made."""

    def __init__(self, opts: GuessOptions) -> None:
        self.opts = opts

    def reset(self, task: int) -> list[dict[str, str]]:
        self.secret, self.guesses = task, 0
        o = self.opts
        return [{"role": "user", "content": f"I am thinking of a number from {o.low} to {o.high}. "
                                            f"You have {o.max_steps} guesses. Answer with a number."}]

    def step(self, assistant_text: str, token_ids: list[int]) -> StepResult:
        self.guesses += 1
        found = re.search(r"-?\d+", assistant_text)  # the model's text is only searched, never evaluated
        if found is None:
            return StepResult(None, 0.0, True, {"success": False, "invalid": True})
        guess = int(found.group())
        if guess == self.secret:
            return StepResult(None, 1.0, True, {"success": True, "guesses": self.guesses})
        if self.guesses == self.opts.max_steps:
            return StepResult(None, 0.0, True, {"success": False, "guesses": self.guesses})
        hint = "Higher." if guess < self.secret else "Lower."
        return StepResult(f"{hint} {self.opts.max_steps - self.guesses} guesses left.", 0.0, False, {})


@register_env("guess_number", options=GuessOptions,
              bounds={"low": (-1000, 1000), "high": (-1000, 1000), "max_steps": (1, 20), "num_tasks": (1, 10_000)})
def make_guess_number(opts: GuessOptions, tokenizer, seed: int) -> EnvSpec:
    """Guess a hidden number in ``max_steps`` tries, with higher/lower hints."""
    if opts.high < opts.low:
        raise InputError("config.env.options.high", f"{opts.high} is below env.options.low = {opts.low}")
    draws = torch.Generator().manual_seed(seed)
    tasks = torch.randint(opts.low, opts.high + 1, (opts.num_tasks,), generator=draws).tolist()
    return EnvSpec(tasks=tasks, make=lambda generator: GuessNumber(opts), max_new_tokens=8)
