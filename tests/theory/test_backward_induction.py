"""Tests of seeupo.theory.backward_induction: reverse sweeps are backward induction; forward needs up to T."""

from __future__ import annotations

import itertools
import random

import pytest
import sympy as sp
import torch

from seeupo.tabular.exact import optimal
from seeupo.tabular.problems import DTYPE, sequential_bandit
from seeupo.theory.backward_induction import (
    FORWARD_TWO_SWEEPS_REWARDS,
    engine_sweep_values,
    forward_needs_two_sweeps,
    optimal_value,
    reward_table,
    sweeps,
    symbolic_reverse_sweep,
)

# a tie-free 3-turn instance on which forward order needs exactly T = 3 sweeps
FORWARD_THREE_SWEEPS_REWARDS = [[[6, 2], [4, 1]], [[3, 5], [7, 0]]]


def _random_policy(acts, rng, *, deterministic=False):
    pol = []
    for t, n in enumerate(acts):
        table = {}
        for prefix in itertools.product(*(range(m) for m in acts[:t])):
            if deterministic:
                k = rng.randrange(n)
                table[prefix] = tuple(sp.Integer(int(a == k)) for a in range(n))
            else:
                w = [sp.Integer(rng.randint(1, 9)) for _ in range(n)]
                table[prefix] = tuple(x / sum(w) for x in w)
        pol.append(table)
    return pol


@pytest.mark.parametrize("num_actions", [(2, 2), (3, 2)])
def test_symbolic_reverse_sweep_is_backward_induction(num_actions):
    proof = symbolic_reverse_sweep(num_actions)
    assert proof.offset_independent
    assert proof.difference == 0
    # J* over symbols is the max of all rewards
    rewards = {(i, j): sp.Symbol(f"r_{i}{j}", real=True) for i in range(num_actions[0]) for j in range(num_actions[1])}
    assert sp.simplify(proof.j_star - sp.Max(*rewards.values())) == 0


def test_optimal_value_matches_engine():
    rewards, acts = reward_table(FORWARD_THREE_SWEEPS_REWARDS)
    table = torch.tensor([FORWARD_THREE_SWEEPS_REWARDS], dtype=DTYPE)
    problem = sequential_bandit(torch.tensor([1.0], dtype=DTYPE), acts, table)
    assert float(optimal_value(rewards, acts)) == pytest.approx(float(optimal(problem).J))


def test_concrete_two_turn_instance():
    res = forward_needs_two_sweeps()
    half = sp.Rational(11, 20)
    assert res["reverse"].values == (half, 1, 1, 1) and res["reverse"].sweeps_to_optimum == 1
    assert res["forward"].values == (half, sp.Rational(3, 5), 1, 1) and res["forward"].sweeps_to_optimum == 2
    assert res["forward"].j_star == 1


@pytest.mark.parametrize("order,expected", [("reverse", [0.55, 1.0, 1.0, 1.0]), ("forward", [0.55, 0.6, 1.0, 1.0])])
def test_engine_agrees_on_the_two_turn_instance(order, expected):
    values = engine_sweep_values(FORWARD_TWO_SWEEPS_REWARDS, order, 3)
    assert values == pytest.approx(expected, abs=1e-12)


def test_reverse_one_sweep_from_any_initial_policy():
    rng = random.Random(0)
    for _ in range(12):
        acts = rng.choice([(2, 3), (3, 2, 2), (2, 2, 2)])
        nested = [rng.randint(0, 20) for _ in range(int(torch.tensor(acts).prod()))]
        rewards = {a: sp.Integer(nested[k]) for k, a in enumerate(itertools.product(*(range(n) for n in acts)))}
        for deterministic in (False, True):
            pol = _random_policy(acts, rng, deterministic=deterministic)
            res = sweeps(rewards, acts, list(reversed(range(len(acts)))), 1, pol)
            assert res.values[1] == res.j_star


def test_forward_needs_at_most_T_sweeps_and_sometimes_exactly_T():
    rng = random.Random(1)
    for _ in range(15):
        acts = (2, 2, 2)
        rewards = {a: sp.Integer(rng.randint(0, 9)) for a in itertools.product(range(2), range(2), range(2))}
        res = sweeps(rewards, acts, [0, 1, 2], 3, _random_policy(acts, rng))
        assert res.sweeps_to_optimum is not None and res.sweeps_to_optimum <= 3
    rewards, acts = reward_table(FORWARD_THREE_SWEEPS_REWARDS)
    res = sweeps(rewards, acts, [0, 1, 2], 3)
    assert res.values == (sp.Rational(7, 2), 5, 6, 7) and res.sweeps_to_optimum == 3 and not res.ties
    assert sweeps(rewards, acts, [2, 1, 0], 1).sweeps_to_optimum == 1


def test_engine_reverse_order_reaches_optimum_in_one_iteration():
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        nested = torch.rand(2, 3, 2, generator=gen, dtype=DTYPE).tolist()
        rewards, acts = reward_table(nested)
        values = engine_sweep_values(nested, "reverse", 1)
        assert values[1] == pytest.approx(float(optimal_value(rewards, acts)), abs=1e-12)


def test_engine_forward_order_matches_idealised_sweeps_on_three_turns():
    """Forward order reaches J* = 7 within T = 3 iterations, as the idealised sweep does.

    A regression test: the argmax step once left 1e-300 on discarded actions, so a path
    through two of them underflowed to probability 0 and its histories were never updated
    again (J stuck at 6). The step now keeps ``ARGMAX_FLOOR`` (1e-12) on every action, which
    moves each value by at most about T * 1e-12 * max reward.
    """
    rewards, acts = reward_table(FORWARD_THREE_SWEEPS_REWARDS)
    idealised = [float(v) for v in sweeps(rewards, acts, [0, 1, 2], 3).values]
    assert engine_sweep_values(FORWARD_THREE_SWEEPS_REWARDS, "forward", 3) == pytest.approx(idealised, abs=1e-9)
