"""Tabular softmax policies over token-spelled actions (`seeupo.tabular.policies`)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from seeupo.tabular.policies import TabularPolicy, token_digits, uniform_probs
from seeupo.tabular.problems import random_sequential_bandit, random_token_bandit, sequential_bandit
from seeupo.tabular.rollout import sample_batch

ATOL = 1e-12


def _problem(kind: str):
    gen = torch.Generator().manual_seed(3)
    if kind == "atomic":
        return random_sequential_bandit(2, (3, 2, 4), num_initial_states=2, generator=gen)
    if kind == "tokens_v2_l2":
        return random_token_bandit(2, 2, 2, 2, generator=gen)
    if kind == "tokens_v3_l2":
        return random_token_bandit(2, 2, 3, 2, generator=gen)
    if kind == "mixed_lengths":  # turn 0: 2 tokens of 2; turn 1: 1 token of 3
        rewards = torch.rand(2, 1, 4, 3, generator=gen, dtype=torch.float64)
        return sequential_bandit(torch.ones(2, 1), (4, 3), rewards, tokens=((2, 2), (3, 1)))
    raise AssertionError(kind)


KINDS = ["atomic", "tokens_v2_l2", "tokens_v3_l2", "mixed_lengths"]


def test_token_digits_most_significant_first():
    prefix, token = token_digits(torch.arange(9), 3, 2)
    assert token.tolist() == [[a // 3, a % 3] for a in range(9)]
    assert prefix.tolist() == [[0, a // 3] for a in range(9)]


@pytest.mark.parametrize("parameterization", ["independent", "shared"])
@pytest.mark.parametrize("kind", KINDS)
def test_action_probs_are_distributions(kind, parameterization):
    problem = _problem(kind)
    policy = TabularPolicy(problem, parameterization, init_scale=1.5, generator=torch.Generator().manual_seed(1))
    probs = policy.action_probs()
    assert len(probs) == problem.num_turns
    for t, p in enumerate(probs):
        assert p.dtype == torch.float64
        assert p.shape == (problem.num_instances, problem.num_histories(t), problem.actions_per_turn[t])
        assert bool((p > 0).all())
        assert torch.allclose(p.sum(-1), torch.ones_like(p.sum(-1)), atol=ATOL, rtol=0)
        # a random initialisation is not uniform
        assert (p - 1.0 / p.shape[-1]).abs().max().item() > 1e-3
    # zero initialisation is the uniform policy
    flat = TabularPolicy(problem, parameterization, init_scale=0.0)
    for p, u in zip(flat.action_probs(), uniform_probs(problem)):
        assert torch.allclose(p, u, atol=ATOL, rtol=0)


@pytest.mark.parametrize("vocab", [2, 3])
def test_action_probs_factorise_over_tokens(vocab):
    """pi(y0 y1 | h) = softmax(l0[h, 0])[y0] * softmax(l1[h, y0])[y1], computed by hand."""
    problem = random_token_bandit(2, 1, vocab, 2, generator=torch.Generator().manual_seed(0))
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(2))
    first, second = policy.logits[0].detach(), policy.logits[1].detach()
    assert first.shape == (2, 1, 1, vocab) and second.shape == (2, 1, vocab, vocab)
    p = policy.action_probs()[0]
    for i, y0, y1 in itertools.product(range(2), range(vocab), range(vocab)):
        expected = torch.softmax(first[i, 0, 0], -1)[y0] * torch.softmax(second[i, 0, y0], -1)[y1]
        assert p[i, 0, y0 * vocab + y1].item() == pytest.approx(expected.item(), abs=ATOL)


@pytest.mark.parametrize("parameterization", ["independent", "shared"])
@pytest.mark.parametrize("kind", KINDS)
def test_token_logps_sum_to_action_log_prob(kind, parameterization):
    problem = _problem(kind)
    policy = TabularPolicy(problem, parameterization, init_scale=1.0, generator=torch.Generator().manual_seed(4))
    batch = sample_batch(problem, policy, tasks=16, group_size=3, generator=torch.Generator().manual_seed(5))
    logps = policy.token_logps(batch)
    assert logps.shape == (batch.num_rows, problem.max_tokens)
    action_logp = policy.action_log_probs()
    rows = zip(batch.turn.tolist(), batch.instance.tolist(), batch.data["hist"].tolist(), batch.data["action"].tolist())
    expected = torch.stack([action_logp[t][i, h, a] for t, i, h, a in rows])
    assert torch.allclose(logps.sum(1), expected, atol=1e-10, rtol=0)
    # padding slots are exactly 0; real tokens are log-probabilities (< 0)
    assert bool((logps[~batch.token_mask] == 0).all())
    assert bool((logps[batch.token_mask] < 0).all())
    # the sampled batch's logp_old is the same thing
    assert torch.allclose(batch.logp_old, logps * batch.token_mask, atol=ATOL, rtol=0)
    if kind == "mixed_lengths":
        assert bool((~batch.token_mask[batch.turn == 1, 1]).all())
        assert bool(batch.token_mask[batch.turn == 0].all())


def test_token_logps_are_differentiable():
    problem = _problem("tokens_v3_l2")
    policy = TabularPolicy(problem, init_scale=1.0)
    batch = sample_batch(problem, policy, tasks=4, group_size=2, generator=torch.Generator().manual_seed(0))
    policy.token_logps(batch).sum().backward()
    grads = [p.grad for p in policy.parameters()]
    assert all(g is not None for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_set_action_probs_round_trip(kind, ref):
    problem = _problem(kind)
    policy = TabularPolicy(problem)
    cases = (ref.random_probs(problem, 1), ref.random_probs(problem, 2, zero_frac=0.5), ref.deterministic_probs(problem, 3))
    for probs in cases:
        policy.set_action_probs(probs)
        got = policy.action_probs()
        for g, p in zip(got, probs):
            assert torch.allclose(g, p, atol=ATOL, rtol=0)
        # the log-probabilities stay finite (zero probabilities become a very negative logit)
        assert all(torch.isfinite(lp).all() for lp in policy.action_log_probs())


def test_set_action_probs_deterministic_token_policy():
    problem = _problem("tokens_v2_l2")  # 4 actions = 2 tokens of 2
    policy = TabularPolicy(problem)
    target = torch.zeros(2, 1, 4)
    target[0, 0, 2] = 1.0  # tokens (1, 0)
    target[1, 0, 1] = 1.0  # tokens (0, 1)
    policy.set_action_probs([target, torch.full((2, 4, 4), 0.25)])
    assert torch.allclose(policy.action_probs()[0], target, atol=ATOL, rtol=0)
    # the conditional at the never-chosen first token is uniform
    second = torch.softmax(policy.logits[1].detach(), -1)
    assert torch.allclose(second[0, 0, 0], torch.tensor([0.5, 0.5]), atol=ATOL, rtol=0)
    assert torch.allclose(second[0, 0, 1], torch.tensor([1.0, 0.0]), atol=ATOL, rtol=0)


def test_set_action_probs_needs_independent_parameters():
    problem = _problem("atomic")
    policy = TabularPolicy(problem, "shared")
    with pytest.raises(ValueError):
        policy.set_action_probs(uniform_probs(problem))


@pytest.mark.parametrize("kind", ["atomic", "tokens_v2_l2"])
def test_parameter_sharing(kind):
    """A gradient step on one history's loss moves other histories only with shared parameters."""
    problem = _problem(kind)
    target_turn, target_hist, target_action = 1, 0, 1
    changes = {}
    for parameterization in ("independent", "shared"):
        policy = TabularPolicy(problem, parameterization, init_scale=0.5, generator=torch.Generator().manual_seed(7))
        before = [p.detach().clone() for p in policy.action_probs()]
        loss = -policy.action_log_probs()[target_turn][0, target_hist, target_action]
        opt = torch.optim.SGD(policy.parameters(), lr=0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()
        after = [p.detach() for p in policy.action_probs()]
        changes[parameterization] = [(a - b).abs() for a, b in zip(after, before)]
        # the targeted probability increased in both cases
        assert after[target_turn][0, target_hist, target_action] > before[target_turn][0, target_hist, target_action] + 1e-6

    indep, shared = changes["independent"], changes["shared"]
    # independent: only the targeted history of the targeted instance moved
    for t, d in enumerate(indep):
        moved = d.amax(-1) > 0
        expected = torch.zeros_like(moved)
        if t == target_turn:
            expected[0, target_hist] = True
        assert torch.equal(moved, expected)
    # shared: another turn and another history of the same turn moved too
    assert shared[0][0].max().item() > 1e-6
    assert shared[target_turn][0, target_hist + 1].max().item() > 1e-6
    # but the instances stay independent (one weight vector per instance)
    assert all(d[1].max().item() == 0 for d in shared)


def _ending_bandit(rewards: list[float]):
    """One turn of 3 binary tokens that ends at token 0: 000 (length 1), 100 (2), 110 and 111 (3); the other
    spellings put a token after the end and are impossible."""
    bandit = sequential_bandit(torch.ones(1, 1), (8,), torch.tensor([[rewards]], dtype=torch.float64), tokens=((2, 3),))
    return dataclasses.replace(bandit, end_token=0)


def test_answers_end_at_the_end_token_by_hand():
    problem = _ending_bandit([0.0] * 8)
    assert problem.answer_lengths(0).tolist() == [1, 1, 1, 1, 2, 2, 3, 3]
    assert problem.possible_actions(0).tolist() == [True, False, False, False, True, False, True, True]
    # uniform token logits: the first token ends half the answers, the second half of the rest
    probs = TabularPolicy(problem).action_probs()[0][0, 0]
    assert probs.tolist() == pytest.approx([1 / 2, 0, 0, 0, 1 / 4, 0, 1 / 8, 1 / 8], abs=ATOL)
    assert uniform_probs(problem)[0][0, 0].tolist() == pytest.approx([1 / 4, 0, 0, 0, 1 / 4, 0, 1 / 4, 1 / 4])


@pytest.mark.parametrize("parameterization", ["independent", "shared"])
def test_an_answer_that_ends_early_is_scored_on_its_own_tokens(parameterization):
    """Every sampled answer is possible, its token mask covers its own tokens, and its token log-probabilities
    sum to its action log-probability (the tokens after its end are not scored)."""
    problem = random_token_bandit(3, 2, 3, 3, end_token=1, generator=torch.Generator().manual_seed(2))
    policy = TabularPolicy(problem, parameterization, init_scale=1.0, generator=torch.Generator().manual_seed(3))
    batch = sample_batch(problem, policy, tasks=64, group_size=2, generator=torch.Generator().manual_seed(4))
    action, turn = batch.data["action"], batch.turn
    lengths = torch.stack([problem.answer_lengths(t)[a] for t, a in zip(turn.tolist(), action.tolist())])
    assert bool(torch.stack([problem.possible_actions(t)[a] for t, a in zip(turn.tolist(), action.tolist())]).all())
    assert batch.token_mask.sum(1).tolist() == lengths.tolist() and set(lengths.tolist()) == {1, 2, 3}
    logps, action_logp = policy.token_logps(batch), policy.action_log_probs()
    expected = torch.stack([action_logp[t][i, h, a] for t, i, h, a in
                            zip(turn.tolist(), batch.instance.tolist(), batch.data["hist"].tolist(), action.tolist())])
    assert torch.allclose(logps.sum(1), expected, atol=1e-10, rtol=0)
    assert bool((logps[~batch.token_mask] == 0).all())
    for p, possible in zip(policy.action_probs(), [problem.possible_actions(t) for t in range(2)]):
        assert torch.allclose(p.sum(-1), torch.ones_like(p.sum(-1)), atol=ATOL, rtol=0)
        assert bool((p[..., ~possible] == 0).all()) and bool((p[..., possible] > 0).all())


def test_set_action_probs_round_trip_with_an_end_token(ref):
    problem = random_token_bandit(2, 2, 2, 3, end_token=0, generator=torch.Generator().manual_seed(5))
    policy = TabularPolicy(problem)
    for seed in (1, 2):
        probs = [p * problem.possible_actions(t) for t, p in enumerate(ref.random_probs(problem, seed))]
        probs = [p / p.sum(-1, keepdim=True) for p in probs]
        policy.set_action_probs(probs)
        for got, want in zip(policy.action_probs(), probs):
            assert torch.allclose(got, want, atol=ATOL, rtol=0)


def test_token_entropies_by_hand_and_an_entropy_bonus_raises_them():
    """Uniform token logits: every spelled token's conditional has entropy log V (answers ending at token 0 stop
    there). An update whose only term is the entropy bonus (advantages 0) raises the entropy from a random start."""
    from seeupo.core.update import UpdateSettings, policy_update
    from seeupo.core.config import preset

    problem = random_token_bandit(2, 2, 3, 2, end_token=0, generator=torch.Generator().manual_seed(0))
    uniform = TabularPolicy(problem)
    batch = sample_batch(problem, uniform, tasks=8, group_size=2, generator=torch.Generator().manual_seed(1))
    entropies = uniform.token_entropies(batch)
    torch.testing.assert_close(entropies[batch.token_mask], torch.full_like(entropies[batch.token_mask], math.log(3)))
    assert bool((entropies[~batch.token_mask] == 0).all())

    policy = TabularPolicy(problem, init_scale=2.0, generator=torch.Generator().manual_seed(2))
    batch = sample_batch(problem, policy, tasks=8, group_size=2, generator=torch.Generator().manual_seed(3))
    before = float(policy.token_entropies(batch)[batch.token_mask].mean())
    cfg = preset("rloo", entropy_coef=1.0)
    policy_update(policy, torch.optim.SGD(policy.parameters(), lr=0.5), batch, torch.zeros_like(batch.logp_old), cfg,
                  UpdateSettings(generator=torch.Generator().manual_seed(0)))
    assert float(policy.token_entropies(batch)[batch.token_mask].mean()) > before + 1e-3
