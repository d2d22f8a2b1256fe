"""Shared fixtures for the tabular tests: problems, random policies, and plain-Python references.

The references in this file deliberately avoid the package's vectorised code: they walk the
history tree recursively with Python floats (``tensor.tolist()``), so a test comparing the
package against them checks the flat-index bookkeeping and the batched arithmetic
independently.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from seeupo.tabular.problems import DTYPE, TreeMDP, random_sequential_bandit, random_tree_mdp





# ----------------------------------------------------------------------------------------------
# random policies
# ----------------------------------------------------------------------------------------------


def random_probs(problem: TreeMDP, seed: int, *, zero_frac: float = 0.0) -> list[torch.Tensor]:
    """A random stochastic policy per turn ``[I, N_t, A_t]``; ``zero_frac`` zeroes some entries.

    At least one action per history keeps positive probability.
    """
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t, a in enumerate(problem.actions_per_turn):
        shape = (problem.num_instances, problem.num_histories(t), a)
        x = -torch.log(torch.rand(shape, generator=gen, dtype=DTYPE))
        if zero_frac > 0:
            drop = torch.rand(shape, generator=gen, dtype=DTYPE) < zero_frac
            keep = torch.nn.functional.one_hot(torch.randint(0, a, shape[:2], generator=gen), a).bool()
            x = torch.where(drop & ~keep, torch.zeros_like(x), x)
        out.append(x / x.sum(-1, keepdim=True))
    return out


def deterministic_probs(problem: TreeMDP, seed: int) -> list[torch.Tensor]:
    """A random deterministic (one-hot) policy per turn."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.nn.functional.one_hot(
            torch.randint(0, a, (problem.num_instances, problem.num_histories(t)), generator=gen), a
        ).to(DTYPE)
        for t, a in enumerate(problem.actions_per_turn)
    ]


# ----------------------------------------------------------------------------------------------
# plain-Python reference (one instance at a time)
# ----------------------------------------------------------------------------------------------


def _instance_lists(problem: TreeMDP, i: int):
    return (
        problem.initial_state_probs[i].tolist(),
        [x[i].tolist() for x in problem.obs_probs],
        [x[i].tolist() for x in problem.rewards],
        [x[i].tolist() for x in problem.terminal],
    )


def brute_force(problem: TreeMDP, pi: list, i: int) -> SimpleNamespace:
    """``J``, ``V``, ``Q``, reach and ``P(alive at turn t)`` of instance ``i`` by a recursive walk.

    ``pi`` is per turn a nested list (or tensor) ``[N_t][A_t]`` for this instance, or the batched
    ``[I, N_t, A_t]`` tensors (then row ``i`` is used). Every history is visited, reachable or not,
    so ``V`` and ``Q`` are defined everywhere (as :func:`seeupo.tabular.exact.evaluate` defines them).
    """
    rho, obs, rew, term = _instance_lists(problem, i)
    pol = []
    for p in pi:
        if isinstance(p, torch.Tensor):
            p = p[i] if p.dim() == 3 else p
            p = p.tolist()
        pol.append(p)
    T = problem.num_turns
    A, O, gamma = problem.actions_per_turn, problem.obs_per_turn, problem.gamma
    V = [dict() for _ in range(T)]
    Q = [dict() for _ in range(T)]
    reach = [dict() for _ in range(T)]

    def walk(t: int, h: int, d: float) -> float:
        reach[t][h] = d
        v = 0.0
        for a in range(A[t]):
            q = 0.0
            for o in range(O[t]):
                p = obs[t][h][a][o]
                end = term[t][h][a][o]
                child = (h * A[t] + a) * O[t] + o
                cont = 0.0
                if t + 1 < T:
                    v_child = walk(t + 1, child, 0.0 if end else d * pol[t][h][a] * p)
                    cont = 0.0 if end else gamma * v_child
                q += p * (rew[t][h][a][o] + cont)
            Q[t][(h, a)] = q
            v += pol[t][h][a] * q
        V[t][h] = v
        return v

    J = 0.0
    for s0, p0 in enumerate(rho):
        J += p0 * walk(0, s0, p0)
    alive = [sum(reach[t].values()) for t in range(T)]
    return SimpleNamespace(J=J, V=V, Q=Q, reach=reach, alive=alive)


def brute_force_optimum(problem: TreeMDP, i: int) -> tuple[float, int]:
    """``max J`` over every deterministic policy of instance ``i``, and how many were tried."""
    slots = [(t, h) for t in range(problem.num_turns) for h in range(problem.num_histories(t))]
    choices = [range(problem.actions_per_turn[t]) for t, _ in slots]
    best, count = -math.inf, 0
    for pick in itertools.product(*choices):
        pol = [[[0.0] * problem.actions_per_turn[t] for _ in range(problem.num_histories(t))] for t in range(problem.num_turns)]
        for (t, h), a in zip(slots, pick):
            pol[t][h][a] = 1.0
        best = max(best, brute_force(problem, pol, i).J)
        count += 1
    return best, count


# ----------------------------------------------------------------------------------------------
# fixtures
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def tree_mdp() -> TreeMDP:
    """3 tree MDPs: 2 initial states, stochastic observations, early termination, per-turn rewards, gamma<1."""
    return random_tree_mdp(
        3, (2, 3, 2), (2, 1, 2), num_initial_states=2, terminate_prob=0.3, per_turn_rewards=True, gamma=0.9,
        generator=torch.Generator().manual_seed(11),
    )


@pytest.fixture
def small_tree_mdp() -> TreeMDP:
    """2 small tree MDPs with discrete rewards (small exact GRAE batches), early termination, gamma<1."""
    return random_tree_mdp(
        2, (3, 2), (2, 1), num_initial_states=2, terminate_prob=0.3, per_turn_rewards=True, gamma=0.8,
        reward_levels=3, generator=torch.Generator().manual_seed(12),
    )


@pytest.fixture
def bandit() -> TreeMDP:
    """2 sequential bandits (the paper's model): 2 initial states, 3 then 2 actions, continuous rewards."""
    return random_sequential_bandit(2, (3, 2), num_initial_states=2, generator=torch.Generator().manual_seed(13))


@pytest.fixture
def token_tree_mdp() -> TreeMDP:
    """A tree MDP whose turn-0 action is 2 tokens of a vocabulary of 2 and turn-1 action 1 token of 3."""
    base = random_tree_mdp(
        2, (4, 3), (2, 1), num_initial_states=2, terminate_prob=0.3, gamma=0.9,
        generator=torch.Generator().manual_seed(14),
    )
    return dataclasses.replace(base, tokens=((2, 2), (3, 1)))


@pytest.fixture
def ref() -> SimpleNamespace:
    """The plain-Python references and policy generators, as one namespace."""
    return SimpleNamespace(
        brute_force=brute_force,
        brute_force_optimum=brute_force_optimum,
        random_probs=random_probs,
        deterministic_probs=deterministic_probs,
    )
