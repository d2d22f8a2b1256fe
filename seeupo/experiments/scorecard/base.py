"""What every scorecard capability is built from: the sizes, the context an algorithm is measured in, a
capability's result, and the seeded problems' pieces shared by the exact capabilities
(:mod:`seeupo.experiments.scorecard.capabilities`, :mod:`seeupo.experiments.scorecard.sampled`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from seeupo.core.config import AlgorithmConfig
from seeupo.experiments.scorecard.rules import Score
from seeupo.tabular.behaviour import Rollouts
from seeupo.tabular.problems import DTYPE, TreeMDP, sequential_bandit

#: The order that seeds each capability's problems (:func:`_generator`): a capability added later goes at the end,
#: so that the problems of those before it stay the same.
SEED_ORDER = ("single_turn_monotone", "multi_turn_monotone", "stochastic_outcomes", "shared_parameters",
              "multi_turn_convergence", "agentic_credit", "reward_invariance", "zero_variance_groups", "lm_bridge",
              "convergence_speed", "sampled_update_safety", "sampled_update_signal", "length_weighting",
              "difficulty_weighting", "off_policy_robustness", "kl_gradient", "pass_at_k_retention")

@dataclass(frozen=True)
class Sizes:
    """How many problems each capability measures (the same sets for every algorithm).

    instances: random problems per part of an experiment (each capability has several parts).
    iterations: exact updates per monotonicity run.
    exact_epochs: optimizer steps per update of a surrogate in exact mode (``seeupo verify``'s).
    group_size: ``G`` of a group estimator, where a part does not set its own.
    starts: random start policies beside the uniform one (credit, invariance).
    convergence_updates: the algorithm's own exact updates per convergence run (times its iterations per update).
    bridge_seeds, bridge_steps: the language-model bridge's seeds and steps per seed.
    sweep_lr: the factors of the exact mode's step size at which the capabilities that run the optimizer are
      measured again (the protocol sweep: no score should be an artefact of one step size); () for none.
    sweep_epochs: the factors of the exact mode's optimizer steps per update (``epochs``, at least 1) at which
      they are measured again, at the card's own step size; () for none.
    seed: seeds every problem and start policy.
    """

    instances: int = 6
    iterations: int = 8
    exact_epochs: int = 40
    group_size: int = 4
    starts: int = 2
    convergence_updates: int = 30
    bridge_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    bridge_steps: int = 5
    sweep_lr: tuple[float, ...] = (0.2, 5.0)
    sweep_epochs: tuple[float, ...] = (0.25,)
    seed: int = 0


QUICK = Sizes(instances=3, iterations=5, exact_epochs=25, starts=1, convergence_updates=15, bridge_seeds=(0, 1, 2), bridge_steps=3,
              sweep_lr=(), sweep_epochs=())


def sweep_points(sizes: Sizes) -> list[str]:
    """The protocol sweep's points, in order, as the keys a card records them under: ``"lr x f"`` for each step-size
    factor, then ``"epochs x f"`` for each factor of the optimizer steps per update."""
    return [f"lr x {f:g}" for f in sizes.sweep_lr] + [f"epochs x {f:g}" for f in sizes.sweep_epochs]


@dataclass
class Measured:
    """One capability's result for one algorithm.

    score: the rule's :class:`~seeupo.experiments.scorecard.rules.Score`; covered: the problems in
    words; worst: the worst case in words (``None`` where every case passed); evidence: files
    (relative to the card's folder) that show it; seconds.
    """

    score: Score
    covered: str
    worst: str | None = None
    evidence: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score.to_dict(), "covered": self.covered, "worst": self.worst,
                "evidence": self.evidence, "seconds": self.seconds}


@dataclass(frozen=True)
class Context:
    """What a capability is measured with: the algorithm (its row of ``seeupo verify``: the
    configuration and the exact mode's optimizer and step), the sizes, where evidence goes, the
    plugins that registered it (recorded in evidence files), and where the rows of the runs of the
    algorithm's own updates come from (``rollouts``: on policy unless ``seeupo scorecard --staleness`` and the
    engine's flags say otherwise; the capabilities that read it have ``Capability.reads_rollouts``)."""

    name: str
    config: AlgorithmConfig
    optimizer: str
    lr: float
    iterations_factor: int
    sizes: Sizes
    out: Path | None
    plugins: tuple[str, ...] = ()
    say: Callable[[str], None] = lambda message: None
    rollouts: Rollouts = Rollouts()


@dataclass(frozen=True)
class Capability:
    """A capability experiment: its name, title (and ``short``, a table's column), tags, the question in words,
    the rule, whether it is exact, the measurement, whether it runs the exact mode's optimizer (``protocol``: its
    score depends on the step size, so the protocol sweep measures it again), and the hand-made algorithm that must
    fail it (``fails``: tests/experiments/scorecard/hand_algorithms.py); ``reads_rollouts``: its runs of the
    algorithm's own updates draw their rows as ``Context.rollouts`` says (the others measure expected steps on
    policy)."""

    name: str
    title: str
    short: str
    tags: tuple[str, ...]
    question: str
    rule: str
    exact: bool
    measure: Callable[[Context], Measured]
    protocol: bool = False
    fails: str = ""
    reads_rollouts: bool = False


# ------------------------------------------------------------------------------------------ problems


def _generator(sizes: Sizes, capability: str, part: int) -> torch.Generator:
    return torch.Generator().manual_seed(sizes.seed * 100_003 + SEED_ORDER.index(capability) * 1009 + part)


def _constant_bandit(num_instances: int, turns: int, value: float) -> TreeMDP:
    """Token bandits (2 tokens of 2) whose every answer earns ``value``: every group has zero variance."""
    rewards = torch.full((num_instances, 1, *(4,) * turns), value, dtype=DTYPE)
    return sequential_bandit(torch.ones(num_instances, 1, dtype=DTYPE), (4,) * turns, rewards, tokens=((2, 2),) * turns)


def _needle_bandit(num_instances: int, turns: int, generator: torch.Generator) -> TreeMDP:
    """Token bandits where one answer sequence (drawn) earns 1 and every other 0: at the uniform policy
    a group of 4 has zero variance with probability ``(1 - 4**-turns)**4`` (0.32 for one turn, 0.77 for two)."""
    rewards = torch.zeros(num_instances, 4 ** turns, dtype=DTYPE)
    rewards[torch.arange(num_instances), torch.randint(4 ** turns, (num_instances,), generator=generator)] = 1.0
    shape = (num_instances, 1, *(4,) * turns)
    return sequential_bandit(torch.ones(num_instances, 1, dtype=DTYPE), (4,) * turns, rewards.reshape(shape),
                             tokens=((2, 2),) * turns)


def _shifted(problem: TreeMDP, scale: float, shift: float) -> TreeMDP:
    """``problem`` with every return ``scale * R + shift`` (a sequential bandit: one reward, at the end)."""
    rewards = [r.clone() for r in problem.rewards]
    rewards[-1] = scale * rewards[-1] + shift
    return dataclasses.replace(problem, rewards=rewards)


def constant_J(problem: TreeMDP) -> torch.Tensor:
    """``[I]`` bool: the instances whose ``J`` is the same under every policy (``J*`` equals the least ``J``).
    No update can raise or lower their ``J``, so they are no evidence of either and the capabilities
    leave them out (a random problem with rewards on 2 levels is such with probability 1/8)."""
    from seeupo.tabular.exact import optimal

    lowest = -optimal(dataclasses.replace(problem, rewards=[-r for r in problem.rewards])).J
    return (optimal(problem).J - lowest).abs() <= 1e-12
