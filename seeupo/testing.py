"""Property-based testing of multi-turn RL algorithms on tabular problems (needs ``hypothesis``).

Hypothesis strategies for random problems and policies, and assertions that an update is
monotone or converges to ``J*``. An update under test is an :class:`AlgorithmConfig` (any
point of the toolkit's algorithm space) or any function ``step(problem, policy)`` that
improves a :class:`TabularPolicy` in place::

    from hypothesis import given, settings
    from seeupo.core import preset
    from seeupo.testing import assert_monotone, sequential_bandits

    @settings(max_examples=20, deadline=None)
    @given(sequential_bandits(max_turns=2, max_actions=3, reward_levels=3))
    def test_my_update_is_monotone(problem):
        assert_monotone(problem, preset("seeupo", epochs=20), iterations=3)
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from seeupo.core.config import AlgorithmConfig
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP, random_family, sequential_bandit
from seeupo.tabular.train import AlgorithmStep, History, RunConfig, Step, initial_policy, track

__all__ = [
    "agentic_mdps", "assert_converges", "assert_monotone", "policies", "sequential_bandits", "token_bandits", "tree_mdps",
]


def _rewards(levels: int | None) -> st.SearchStrategy[float]:
    if levels is None:
        return st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False)
    return st.integers(0, levels - 1).map(lambda k: k / (levels - 1))


def _simplex(draw: st.DrawFn, size: int) -> list[float]:
    weights = draw(st.lists(st.integers(1, 4), min_size=size, max_size=size))
    return [w / sum(weights) for w in weights]


@st.composite
def sequential_bandits(
    draw: st.DrawFn,
    *,
    min_turns: int = 1,
    max_turns: int = 3,
    max_actions: int = 3,
    max_initial_states: int = 2,
    reward_levels: int | None = None,
) -> TreeMDP:
    """Single-instance sequential bandits; rewards uniform on [0, 1] or on ``reward_levels`` levels."""
    turns = draw(st.integers(min_turns, max_turns))
    actions = tuple(draw(st.lists(st.integers(2, max_actions), min_size=turns, max_size=turns)))
    s0 = draw(st.integers(1, max_initial_states))
    n = s0
    for a in actions:
        n *= a
    rewards = draw(st.lists(_rewards(reward_levels), min_size=n, max_size=n))
    rho = torch.tensor(_simplex(draw, s0), dtype=DTYPE)
    return sequential_bandit(rho, actions, torch.tensor(rewards, dtype=DTYPE).reshape(s0, *actions))


@st.composite
def token_bandits(
    draw: st.DrawFn,
    *,
    min_turns: int = 1,
    max_turns: int = 2,
    vocab_size: int = 2,
    length: int = 2,
    reward_levels: int | None = None,
) -> TreeMDP:
    """Sequential bandits with one initial state whose actions are ``length`` tokens from ``vocab_size``."""
    turns = draw(st.integers(min_turns, max_turns))
    a = vocab_size**length
    rewards = draw(st.lists(_rewards(reward_levels), min_size=a**turns, max_size=a**turns))
    return sequential_bandit(
        torch.ones(1, dtype=DTYPE), (a,) * turns, torch.tensor(rewards, dtype=DTYPE).reshape(1, *(a,) * turns),
        tokens=((vocab_size, length),) * turns,
    )


@st.composite
def tree_mdps(
    draw: st.DrawFn,
    *,
    min_turns: int = 1,
    max_turns: int = 3,
    max_actions: int = 2,
    max_observations: int = 2,
    gamma: float | None = None,
    reward_levels: int | None = None,
    tokens: tuple[int, int] | None = None,
) -> TreeMDP:
    """Single-instance tree MDPs with stochastic observations, per-turn rewards and early termination.

    With ``tokens=(V, L)`` every action is ``L`` tokens from a vocabulary of ``V`` (``A_t = V**L``,
    ``max_actions`` is ignored).
    """
    turns = draw(st.integers(min_turns, max_turns))
    if tokens is not None:
        actions = (tokens[0] ** tokens[1],) * turns
    else:
        actions = tuple(draw(st.lists(st.integers(2, max_actions), min_size=turns, max_size=turns)))
    obs = tuple(draw(st.lists(st.integers(1, max_observations), min_size=turns, max_size=turns)))
    g = gamma if gamma is not None else draw(st.sampled_from([1.0, 0.9, 0.5]))
    obs_probs, rewards, terminal = [], [], []
    n = 1
    for t, (a, o) in enumerate(zip(actions, obs)):
        probs = [_simplex(draw, o) for _ in range(n * a)]
        obs_probs.append(torch.tensor(probs, dtype=DTYPE).reshape(1, n, a, o))
        rewards.append(torch.tensor(draw(st.lists(_rewards(reward_levels), min_size=n * a * o, max_size=n * a * o)), dtype=DTYPE).reshape(1, n, a, o))
        last = t == turns - 1
        ends = [True] * (n * a * o) if last else draw(st.lists(st.booleans(), min_size=n * a * o, max_size=n * a * o))
        terminal.append(torch.tensor(ends).reshape(1, n, a, o))
        n *= a * o
    token_spec = (tokens,) * turns if tokens is not None else None
    return TreeMDP(torch.ones(1, 1, dtype=DTYPE), actions, obs, obs_probs, rewards, terminal, g, token_spec)


@st.composite
def agentic_mdps(
    draw: st.DrawFn,
    family: str,
    *,
    min_turns: int = 2,
    max_turns: int = 3,
    reward_levels: int | None = 3,
) -> TreeMDP:
    """Single-instance problems of an agentic family (:data:`seeupo.tabular.families.AGENTIC_FAMILIES`):
    action 0 stops at every turn but the last, with the family's intermediate rewards, tool results
    and token actions; rewards on ``reward_levels`` levels (``None``: uniform on [0, 1]).

    The problem is drawn from a seed (:func:`seeupo.tabular.problems.random_family`), so hypothesis
    shrinks towards fewer turns and smaller seeds, not towards simpler tables.
    """
    turns = draw(st.integers(min_turns, max_turns))
    seed = draw(st.integers(0, 2**16))
    return random_family(family, 1, turns, reward_levels=reward_levels, generator=torch.Generator().manual_seed(seed))


@st.composite
def policies(draw: st.DrawFn, problem: TreeMDP, *, max_logit: int = 3) -> list[torch.Tensor]:
    """Strictly positive policies for ``problem`` (per turn ``[I, N_t, A_t]``), from integer logits."""
    out = []
    for t, a in enumerate(problem.actions_per_turn):
        size = problem.num_instances * problem.num_histories(t) * a
        logits = draw(st.lists(st.integers(-max_logit, max_logit), min_size=size, max_size=size))
        table = torch.tensor(logits, dtype=DTYPE).reshape(problem.num_instances, problem.num_histories(t), a)
        out.append(torch.softmax(table, -1))
    return out


def _as_step(update: AlgorithmConfig | Step, run_cfg: RunConfig) -> Step:
    return AlgorithmStep(update, run_cfg) if isinstance(update, AlgorithmConfig) else update


def _start(problem: TreeMDP, run_cfg: RunConfig, start: list[torch.Tensor] | None) -> TabularPolicy:
    policy = initial_policy(problem, run_cfg)
    if start is not None:
        policy.set_action_probs(start)
    return policy


def assert_monotone(
    problem: TreeMDP,
    update: AlgorithmConfig | Step,
    *,
    iterations: int = 5,
    tol: float = 1e-9,
    start: list[torch.Tensor] | None = None,
    run_cfg: RunConfig = RunConfig(),
) -> History:
    """Fail if the exact ``J`` of any instance decreases by more than ``tol`` in any of ``iterations`` updates.

    ``start`` is the initial policy (per-turn probabilities; default: ``run_cfg``'s).
    """
    hist = track(problem, _as_step(update, run_cfg), _start(problem, run_cfg, start), iterations)
    drops = hist.violations(tol)
    if bool((drops > 0).any()):
        k, i = (int(x) for x in (drops == drops.max()).nonzero()[0])
        raise AssertionError(
            f"J decreased by {float(drops[k, i]):.3e} at iteration {k + 1} on instance {i}: "
            f"{float(hist.J[k, i]):.9f} -> {float(hist.J[k + 1, i]):.9f} (J* = {float(hist.J_star[i]):.6f})"
        )
    return hist


def assert_converges(
    problem: TreeMDP,
    update: AlgorithmConfig | Step,
    *,
    iterations: int = 50,
    gap_tol: float = 1e-3,
    start: list[torch.Tensor] | None = None,
    run_cfg: RunConfig = RunConfig(),
) -> History:
    """Fail unless every instance ends within ``gap_tol`` of ``J*`` after ``iterations`` updates."""
    hist = track(problem, _as_step(update, run_cfg), _start(problem, run_cfg, start), iterations)
    gap = hist.gap[-1]
    if bool((gap > gap_tol).any()):
        i = int(gap.argmax())
        raise AssertionError(
            f"instance {i} ended {float(gap[i]):.3e} below J* = {float(hist.J_star[i]):.6f} after {iterations} "
            f"iterations (J went {float(hist.J[0, i]):.6f} -> {float(hist.J[-1, i]):.6f})"
        )
    return hist
