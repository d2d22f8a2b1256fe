"""Training loops (`seeupo.tabular.train`): the idealised SeeUPO claims in exact mode."""

from __future__ import annotations

import math

import pytest
import torch

from seeupo.core import preset
from seeupo.tabular.exact import evaluate, optimal
from seeupo.tabular.policies import uniform_probs
from seeupo.tabular.problems import random_sequential_bandit, random_token_bandit, random_tree_mdp, sequential_bandit
from seeupo.tabular.train import History, RunConfig, run

ATOL = 1e-12
ARGMAX = RunConfig(mode="exact", update="mirror", mirror_beta=0.0, iterations=1)


@pytest.mark.parametrize(
    "actions, levels, num_s0",
    [((3, 3), None, 2), ((2, 2, 2), None, 1), ((3, 2, 3), 5, 2), ((2, 3, 2), 3, 1)],
)
def test_reverse_argmax_mirror_reaches_optimum_in_one_iteration(actions, levels, num_s0):
    """Theorem 2 (docs/method.md §3 D): reverse-order sequential argmax steps = backward induction."""
    problem = random_sequential_bandit(
        6, actions, num_initial_states=num_s0, reward_levels=levels, generator=torch.Generator().manual_seed(len(actions) + num_s0)
    )
    history = run(problem, preset("seeupo"), ARGMAX)
    j_star = optimal(problem).J
    assert torch.allclose(history.J[0], evaluate(problem, uniform_probs(problem)).J, atol=ATOL, rtol=0)
    assert bool((history.J[0] < j_star - 1e-3).all())  # the uniform start is not optimal
    assert torch.allclose(history.J[1], j_star, atol=1e-10, rtol=0)
    assert torch.allclose(history.J_star, j_star, atol=ATOL, rtol=0)


def test_reverse_argmax_mirror_token_actions():
    # tokens do not matter to the sequence-level argmax step: still optimal in one sweep
    problem = random_token_bandit(4, 2, 2, 2, generator=torch.Generator().manual_seed(3))
    history = run(problem, preset("seeupo"), ARGMAX)
    assert torch.allclose(history.J[1], optimal(problem).J, atol=1e-10, rtol=0)


HAND_BUILT = [[[0.6, 0.6], [1.0, 0.0]]]  # r(a0, a1): a0 = 0 is best on average, a0 = 1 then a1 = 0 is optimal


def test_forward_argmax_mirror_is_not_optimal_after_one_iteration():
    problem = sequential_bandit([1.0], (2, 2), HAND_BUILT)
    assert optimal(problem).J.item() == pytest.approx(1.0)
    forward = run(problem, preset("seeupo", order="forward"), RunConfig(update="mirror", mirror_beta=0.0, iterations=1))
    reverse = run(problem, preset("seeupo"), RunConfig(update="mirror", mirror_beta=0.0, iterations=1))
    assert forward.J[0].item() == pytest.approx(0.55)  # uniform: (0.6 + 0.6 + 1.0 + 0.0) / 4
    # forward: turn 0 sees the advantage under the uniform turn-1 policy and takes a0 = 0
    assert forward.J[1].item() == pytest.approx(0.6, abs=1e-10)
    assert forward.policy.action_probs()[0][0, 0, 0].item() == pytest.approx(1.0)
    assert reverse.J[1].item() == pytest.approx(1.0, abs=1e-10)


def test_forward_argmax_mirror_reaches_optimum_by_sweep_T():
    """Forward order needs up to T sweeps (docs/method.md §3 leads).

    After the first argmax step the policy is deterministic; the exact mode still sees the
    other paths because set_action_probs keeps an infinitesimal (1e-300) probability on them,
    which the HAPPO weight M rescales. With T = 2 no product of such probabilities underflows.
    """
    problem = sequential_bandit([1.0], (2, 2), HAND_BUILT)
    history = run(problem, preset("seeupo", order="forward"), RunConfig(update="mirror", mirror_beta=0.0, iterations=2))
    assert history.J[1].item() < 0.7
    assert history.J[2].item() == pytest.approx(1.0, abs=1e-10)

    random_problems = random_sequential_bandit(8, (3, 3), num_initial_states=2, generator=torch.Generator().manual_seed(4))
    history = run(random_problems, preset("seeupo", order="forward"), RunConfig(update="mirror", mirror_beta=0.0, iterations=2))
    j_star = optimal(random_problems).J
    assert bool((history.J[1] < j_star - 1e-6).any())  # some instance is not solved by one forward sweep
    assert torch.allclose(history.J[2], j_star, atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    "name, problem",
    [
        ("bandit", random_sequential_bandit(6, (3, 3), num_initial_states=2, reward_levels=5, generator=torch.Generator().manual_seed(2))),
        ("bandit_T3", random_sequential_bandit(6, (2, 2, 2), generator=torch.Generator().manual_seed(3))),
        ("tokens", random_token_bandit(6, 2, 2, 2, reward_levels=3, generator=torch.Generator().manual_seed(4))),
        ("tree", random_tree_mdp(6, (2, 2), (2, 1), reward_levels=3, generator=torch.Generator().manual_seed(5))),
    ],
)
@pytest.mark.parametrize("optimizer, lr, init_scale", [("adam", 0.1, 0.0), ("adam", 0.5, 1.0), ("sgd", 1.0, 1.0)])
def test_exact_seeupo_gradient_is_monotone(name, problem, optimizer, lr, init_scale):
    """Exact-mode SeeUPO (HAML sequential PPO-clip steps) never decreases J (docs/method.md §3 D, Theorem 1)."""
    cfg = RunConfig(mode="exact", update="gradient", iterations=6, optimizer=optimizer, lr=lr, init_scale=init_scale)
    history = run(problem, preset("seeupo"), cfg)
    assert history.violations(1e-9).max().item() == 0.0
    assert bool((history.J[1:] - history.J[:-1] >= -1e-9).all())
    # and it does learn
    assert bool((history.J[-1] > history.J[0] + 1e-3).all())
    assert bool((history.J <= history.J_star + 1e-12).all())


def test_history_shapes_and_violations():
    problem = random_sequential_bandit(3, (2, 2), generator=torch.Generator().manual_seed(1))
    history = run(problem, preset("seeupo"), RunConfig(iterations=4))
    assert isinstance(history, History)
    assert history.J.shape == (5, 3)
    assert history.J_star.shape == (3,)
    assert history.gap.shape == (5, 3)
    assert history.kl.shape == (4, 3)
    assert history.violations().shape == (4, 3)
    assert torch.allclose(history.gap, history.J_star[None] - history.J, atol=0, rtol=0)
    assert bool((history.gap >= -1e-12).all())
    assert bool((history.kl >= -1e-15).all()) and history.kl.max().item() > 0

    # violations reports the size of each decrease larger than the tolerance, and 0 elsewhere
    J = torch.tensor([[0.0, 0.0], [1.0, -1.0], [0.5, -1.0 - 1e-12], [0.7, -2.0]])
    made = History(J=J, J_star=torch.ones(2), kl=torch.zeros(3, 2), policy=history.policy)
    expected = torch.tensor([[0.0, 1.0], [0.5, 0.0], [0.0, 1.0 - 1e-12]])
    assert torch.allclose(made.violations(1e-9), expected, atol=1e-15, rtol=0)
    assert made.violations(0.6).tolist() == [[0.0, 1.0], [0.0, 0.0], [0.0, pytest.approx(1.0 - 1e-12)]]
    assert made.gap.shape == (4, 2)


def test_zero_iterations():
    problem = random_sequential_bandit(2, (2, 2), generator=torch.Generator().manual_seed(1))
    history = run(problem, preset("seeupo"), RunConfig(iterations=0))
    assert history.J.shape == (1, 2) and history.kl.shape == (0, 2) and history.violations().shape == (0, 2)


def test_forward_argmax_sweeps_reach_j_star_within_t_iterations_on_three_turns():
    # regression: argmax steps once left 1e-300 on discarded actions, paths through two of them
    # underflowed to probability 0, and forward order needed T + 1 sweeps on this batch
    problem = random_sequential_bandit(6, (3, 3, 3), num_initial_states=2, generator=torch.Generator().manual_seed(1))
    hist = run(problem, preset("seeupo", order="forward"), RunConfig(update="mirror", mirror_beta=0.0, iterations=3))
    assert float(hist.gap[-1].max()) < 1e-9


@pytest.mark.parametrize("estimator, placement, expected", [
    # k1 in the reward: max E[R] - beta KL(pi || ref) gives pi proportional to ref exp(R / beta): e^2 / (1 + e^2)
    ("k1", "reward", math.exp(2) / (1 + math.exp(2))),
    # k3 in the loss: grad J = beta grad KL(ref || pi), p (1 - p) = beta (p - 1/2): p = (1 - beta + sqrt((1 - beta)^2
    # + 2 beta)) / 2 = (1/2 + sqrt(5/4)) / 2
    ("k3", "loss", (0.5 + math.sqrt(1.25)) / 2),
])
def test_a_kl_term_stops_the_run_at_its_regularised_optimum(estimator, placement, expected):
    """Two answers paying 0 and 1, the reference the uniform start, beta = 1/2: RLOO's exact updates (an unbiased
    policy gradient) settle where the KL gradient of the placement balances grad J, not at J*."""
    problem = sequential_bandit(torch.ones(1, 1), (2,), torch.tensor([[[0.0, 1.0]]], dtype=torch.float64))
    cfg = preset("rloo", kl_coef=0.5, kl_estimator=estimator, kl_placement=placement)
    history = run(problem, cfg, RunConfig(mode="exact", optimizer="sgd", lr=5.0, iterations=400))
    assert float(history.policy.action_probs()[0][0, 0, 1]) == pytest.approx(expected, abs=1e-6)
    assert float(history.J[-1, 0]) == pytest.approx(expected, abs=1e-6) and float(history.J_star[0]) == 1.0


def test_a_stale_run_draws_each_update_s_rows_from_the_policy_k_updates_earlier():
    """staleness=1: the first update is on policy; the second reads the start policy's rows while updating the
    policy after the first, exactly as exact_advantages(..., behaviour=start) followed by the update."""
    from seeupo.core.update import UpdateSettings, policy_update
    from seeupo.tabular.kl import reference_policy
    from seeupo.tabular.policies import TabularPolicy
    from seeupo.tabular.rollout import exact_advantages
    from seeupo.tabular.train import AlgorithmStep, make_optimizer

    problem = random_token_bandit(2, 2, 2, 2, reward_levels=3, generator=torch.Generator().manual_seed(0))
    cfg = preset("rloo", advantage="oracle", correction="sequence_is", correction_cap=1e6)
    run_cfg = RunConfig(mode="exact", optimizer="sgd", lr=5.0, staleness=1)
    stale = TabularPolicy(problem)
    step = AlgorithmStep(cfg, run_cfg)
    step(problem, stale)
    first = reference_policy(problem, stale)
    step(problem, stale)

    by_hand = TabularPolicy(problem)
    step_by_hand = AlgorithmStep(cfg, RunConfig(mode="exact", optimizer="sgd", lr=5.0))
    step_by_hand(problem, by_hand)  # the same first update, on policy
    start = reference_policy(problem, TabularPolicy(problem))
    batch, adv = exact_advantages(problem, by_hand, cfg, behaviour=start)
    assert batch.logp_behaviour is not None
    policy_update(by_hand, make_optimizer(by_hand.parameters(), run_cfg), batch, adv, cfg,
                  UpdateSettings(generator=torch.Generator().manual_seed(0)))
    for a, b in zip(stale.action_probs(), by_hand.action_probs()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert not all(torch.equal(a, b) for a, b in zip(stale.action_probs(), first.action_probs()))


def test_a_sampled_run_draws_each_update_s_rows_through_the_engine_s_sampler():
    """RunConfig(sampler=...): each update reads rows drawn through the sampler from the policy it updates, exactly
    as exact_advantages(..., behaviour=behaviour_policy(pi, sampler)) followed by the update; an on-policy sampler
    (temperature 1, no truncation, no noise) is the plain run."""
    from seeupo.core.update import UpdateSettings, policy_update
    from seeupo.tabular.behaviour import Sampler, behaviour_policy
    from seeupo.tabular.policies import TabularPolicy
    from seeupo.tabular.rollout import exact_advantages
    from seeupo.tabular.train import AlgorithmStep, make_optimizer

    problem = random_token_bandit(2, 2, 2, 2, reward_levels=3, generator=torch.Generator().manual_seed(1))
    cfg = preset("rloo", advantage="oracle", correction="token_is")
    sampler = Sampler(temperature=0.7, top_p=0.9)
    run_cfg = RunConfig(mode="exact", optimizer="sgd", lr=5.0, sampler=sampler)
    gen = torch.Generator().manual_seed(2)
    start = [torch.softmax(torch.randn(p.shape, generator=gen, dtype=torch.float64), -1)
             for p in TabularPolicy(problem).action_probs()]

    def at_start() -> TabularPolicy:
        out = TabularPolicy(problem)
        out.set_action_probs(start)
        return out

    policy = at_start()
    AlgorithmStep(cfg, run_cfg)(problem, policy)

    by_hand = at_start()
    batch, adv = exact_advantages(problem, by_hand, cfg, behaviour=behaviour_policy(problem, by_hand, sampler))
    policy_update(by_hand, make_optimizer(by_hand.parameters(), run_cfg), batch, adv, cfg,
                  UpdateSettings(generator=torch.Generator().manual_seed(0)))
    for a, b in zip(policy.action_probs(), by_hand.action_probs()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)

    plain, through = at_start(), at_start()
    AlgorithmStep(cfg, RunConfig(mode="exact", optimizer="sgd", lr=5.0))(problem, plain)
    AlgorithmStep(cfg, RunConfig(mode="exact", optimizer="sgd", lr=5.0, sampler=Sampler()))(problem, through)
    for a, b, c in zip(plain.action_probs(), through.action_probs(), policy.action_probs()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert not torch.allclose(a, c, rtol=0, atol=1e-6)  # the sampler changed the update
