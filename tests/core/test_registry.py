"""The registries: one decorated function adds an estimator, a loss, an aggregation, a turn order or an M factor
that the whole core uses."""

from __future__ import annotations

import math

import pytest
import torch

from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import SampleBatch, per_trajectory
from seeupo.core.config import AlgorithmConfig, choices
from seeupo.core.losses import aggregate
from seeupo.core.registry import (
    ADV_ESTIMATORS,
    AGGREGATIONS,
    M_FACTORS,
    POLICY_LOSSES,
    TURN_ORDERS,
    register_adv_est,
    register_aggregation,
    register_m_factor,
    register_policy_loss,
    register_turn_order,
)
from seeupo.core.update import compute_advantages, final_factor, policy_update, turn_order
from seeupo.validation.errors import InputError
from seeupo.validation.schemas import dataclass_from_dict

DT = torch.float64


class ParamPolicy:
    """``log pi`` of every token is its own parameter: gradients are the objective's partial derivatives."""

    def __init__(self, theta: torch.Tensor):
        self.theta = theta.clone().requires_grad_(True)

    def token_logps(self, batch: SampleBatch) -> torch.Tensor:
        return self.theta[batch.data["row"]]

    def parameters(self):
        return [self.theta]


def group_batch(make_batch, returns, *, instance=None) -> SampleBatch:
    """One single-token row per trajectory, every trajectory in group 0."""
    n = len(returns)
    return make_batch(
        traj_id=list(range(n)), token_mask=[[True]] * n, traj_return=returns, instance=instance,
        data={"row": torch.arange(n)},
    )


def test_builtins_are_the_config_choices():
    c = choices()
    # built-ins first, in this order (entries registered later, by users, follow)
    assert c["advantage"][:3] == ("oracle", "gae", "grae") and c["advantage"] == ADV_ESTIMATORS.names()
    assert c["update"][:2] == ("reinforce", "ppo") and c["update"] == POLICY_LOSSES.names()
    assert c["aggregation"][:3] == ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
    assert c["aggregation"] == AGGREGATIONS.names()
    assert c["order"][:4] == ("reverse", "forward", "random", "custom") and c["order"] == TURN_ORDERS.names()
    assert c["m_factor"][:3] == ("none", "happo", "clipped") and c["m_factor"] == M_FACTORS.names()
    assert c["schedule"] == ("simultaneous", "sequential")  # the non-registry choices read the Literal
    assert not M_FACTORS.get("none").uses_ratio and M_FACTORS.get("happo").uses_ratio
    assert ADV_ESTIMATORS.get("gae").needs_critic and ADV_ESTIMATORS.get("grae").needs_group_stats
    assert not POLICY_LOSSES.get("reinforce").surrogate and POLICY_LOSSES.get("ppo").surrogate


def test_registered_estimator_is_valid_in_config_and_used_by_compute_advantages(registered, make_batch):
    with pytest.raises(ValueError, match="group_median"):
        AlgorithmConfig(advantage="group_median")

    @register_adv_est("group_median", needs_group_stats=True, exact=False)
    def group_median(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
        """R_i minus the median return of its group, on every token of the trajectory."""
        r, g = per_trajectory(batch.traj_return, batch), per_trajectory(batch.group_id, batch)
        med = torch.stack([r[g == k].median() for k in g.tolist()])
        return broadcast_to_tokens((r - med)[batch.traj_id], batch)

    registered.append((ADV_ESTIMATORS, "group_median"))
    cfg = AlgorithmConfig(advantage="group_median", group_size=3)
    assert "group_median" in choices()["advantage"]
    # trajectory 0 has two turns (the second with one padded token); groups {0, 1, 2} and {3, 4}
    batch = make_batch(
        traj_id=[0, 0, 1, 2, 3, 4], turn=[0, 1, 0, 0, 0, 0], group_id=[0, 0, 0, 0, 1, 1],
        token_mask=[[True, True], [True, False]] + [[True, True]] * 4,
        traj_return=[1.0, 1.0, 4.0, 2.0, 3.0, 5.0],
    )
    # by hand: median{1, 4, 2} = 2; torch's median of {3, 5} is the lower middle value, 3
    assert compute_advantages(batch, cfg).tolist() == [
        [-1.0, -1.0], [-1.0, 0.0], [2.0, 2.0], [0.0, 0.0], [0.0, 0.0], [2.0, 2.0]]
    # the declared need for group statistics carries the group-size rule
    with pytest.raises(ValueError, match="group_size must be >= 2 for 'group_median'"):
        AlgorithmConfig(advantage="group_median", group_size=1)


def test_config_files_accept_a_registered_name_and_name_the_field_otherwise(registered):
    with pytest.raises(InputError, match=r"config\.algorithm\.update.*expected one of \['reinforce', 'ppo'\]"):
        dataclass_from_dict(AlgorithmConfig, {"update": "halved"}, "config.algorithm")

    @register_policy_loss("halved", surrogate=False)
    def halved(logp_new, batch, adv, settings):
        """Half the REINFORCE objective."""
        return 0.5 * logp_new * adv, None

    registered.append((POLICY_LOSSES, "halved"))
    assert dataclass_from_dict(AlgorithmConfig, {"update": "halved"}, "config.algorithm").update == "halved"


def test_estimator_needs_are_enforced(registered, make_batch):
    @register_adv_est("critic_echo", needs_critic=True)
    def critic_echo(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
        """The critic's value itself."""
        return critic_values

    registered.append((ADV_ESTIMATORS, "critic_echo"))
    batch = group_batch(make_batch, [1.0, 0.0])
    cfg = AlgorithmConfig(advantage="critic_echo")
    with pytest.raises(ValueError, match="needs critic values"):
        compute_advantages(batch, cfg)
    values = torch.tensor([[0.5], [-0.25]], dtype=DT)
    assert compute_advantages(batch, cfg, critic_values=values).tolist() == [[0.5], [-0.25]]


def test_registered_policy_loss_drives_policy_update(registered, make_batch):
    @register_policy_loss("log_regression")
    def log_regression(logp_new, batch, adv, settings):
        """Pull each token's log-probability towards its advantage; 'clipped' where they are more than 1 apart."""
        return -((logp_new - adv) ** 2), (logp_new - adv).abs() > 1.0

    registered.append((POLICY_LOSSES, "log_regression"))
    batch = group_batch(make_batch, [0.0, 0.0, 0.0])
    adv = torch.tensor([[-1.0], [2.0], [0.0]], dtype=DT)
    policy = ParamPolicy(torch.zeros(3, 1, dtype=DT))
    cfg = AlgorithmConfig(update="log_regression", advantage="oracle", aggregation="token_mean")
    stats = policy_update(policy, torch.optim.SGD(policy.parameters(), lr=0.3), batch, adv, cfg)
    # by hand: objective = -(1/3) sum_i (theta_i - A_i)^2, gradient at theta = 0 is (2/3) A,
    # one ascent step of 0.3 gives theta = 0.2 A; objective before the step -(1 + 4 + 0)/3
    assert policy.theta.detach().squeeze(1).tolist() == pytest.approx([-0.2, 0.4, 0.0], abs=1e-12)
    assert stats.objective == [pytest.approx(-5.0 / 3.0)]
    assert stats.clip_frac == [pytest.approx(1.0 / 3.0)]  # |0 - 2| > 1 on one token of three


def test_registered_aggregation_normalises_the_objective(registered, make_batch):
    @register_aggregation("token_sum")
    def token_sum(n_tokens, weight):
        """Sum of every real token (a single instance's normaliser is 1)."""
        return weight, weight / weight.sum()

    registered.append((AGGREGATIONS, "token_sum"))
    batch = make_batch(traj_id=[0, 1], token_mask=[[True, True], [True, False]], data={"row": torch.arange(2)})
    values = torch.tensor([[1.0, 2.0], [4.0, 100.0]], dtype=DT)
    assert float(aggregate(values, batch, "token_sum")) == pytest.approx(7.0)
    # through the update: REINFORCE with unit advantages, the gradient of sum log pi is 1 per real token
    policy = ParamPolicy(torch.zeros(2, 2, dtype=DT))
    cfg = AlgorithmConfig(update="reinforce", advantage="oracle", aggregation="token_sum")
    policy_update(policy, torch.optim.SGD(policy.parameters(), lr=0.5), batch, torch.ones(2, 2, dtype=DT), cfg)
    assert policy.theta.detach().tolist() == [[0.5, 0.5], [0.5, 0.0]]


def test_name_clash_raises_and_keeps_the_existing_entry():
    before = ADV_ESTIMATORS.get("grae")
    with pytest.raises(ValueError, match="advantage estimator 'grae' is already registered"):
        register_adv_est("grae")(lambda batch, cfg, **kw: None)
    with pytest.raises(ValueError, match="policy loss 'ppo' is already registered"):
        register_policy_loss("ppo")(lambda *a: None)
    with pytest.raises(ValueError, match="loss aggregation 'token_mean' is already registered"):
        register_aggregation("token_mean")(lambda *a: None)
    with pytest.raises(ValueError, match="turn order 'reverse' is already registered"):
        register_turn_order("reverse")(lambda *a: None)
    with pytest.raises(ValueError, match="M factor 'happo' is already registered"):
        register_m_factor("happo")(lambda *a: None)
    assert TURN_ORDERS.get("reverse").fn(3, None, None) == [2, 1, 0]
    assert ADV_ESTIMATORS.get("grae") is before


@pytest.mark.parametrize("field, registry", [("advantage", ADV_ESTIMATORS), ("update", POLICY_LOSSES),
                                             ("aggregation", AGGREGATIONS), ("order", TURN_ORDERS),
                                             ("m_factor", M_FACTORS)])
def test_unknown_name_is_one_line_listing_the_registered_names(field, registry):
    with pytest.raises(ValueError) as err:
        AlgorithmConfig(**{field: "nope"})
    message = str(err.value)
    assert "\n" not in message and f"AlgorithmConfig.{field}='nope'" in message
    assert all(name in message for name in registry.names())



# ---- the sequential schedule's pieces: turn orders and M factors

LR = 0.5
SEQUENTIAL = dict(advantage="oracle", update="reinforce", schedule="sequential")


def sequential_run(make_batch, cfg, num_turns, adv):
    """One trajectory of ``num_turns`` one-token rows; REINFORCE on ``log pi = theta`` (``logp_old = 0``), SGD, ``LR``.

    Turn ``t``'s update is one step on ``theta_t * M_t``, so ``theta_t = LR * M_t`` and its ratio is
    ``exp(theta_t)``. Returns ``(theta, stats, policy, batch)``.
    """
    batch = make_batch(traj_id=[0] * num_turns, turn=list(range(num_turns)), token_mask=[[True]] * num_turns,
                       data={"row": torch.arange(num_turns)})
    policy = ParamPolicy(torch.zeros(num_turns, 1, dtype=DT))
    stats = policy_update(policy, torch.optim.SGD(policy.parameters(), lr=LR), batch,
                          torch.tensor(adv, dtype=DT)[:, None], cfg)
    return policy.theta.detach().squeeze(1).tolist(), stats, policy, batch


def test_registered_turn_order_is_valid_in_config_and_drives_the_sweep(registered, make_batch):
    with pytest.raises(ValueError, match="order='odd_first'"):
        AlgorithmConfig(order="odd_first")

    @register_turn_order("odd_first")
    def odd_first(num_turns, cfg, generator):
        """The odd turns, then the even ones, each in ascending order."""
        return [t for t in range(num_turns) if t % 2] + [t for t in range(num_turns) if t % 2 == 0]

    registered.append((TURN_ORDERS, "odd_first"))
    cfg = AlgorithmConfig(order="odd_first", **SEQUENTIAL)
    assert "odd_first" in choices()["order"]
    assert turn_order(cfg, 5) == [1, 3, 0, 2, 4]
    theta, stats, _, _ = sequential_run(make_batch, cfg, 4, [1.0, 1.0, 1.0, 1.0])
    assert stats.turn_order == [1, 3, 0, 2]
    # by hand (HAPPO, A = 1): each turn's weight is the product of exp(theta) over the turns before it
    t1 = LR
    t3 = LR * math.exp(t1)
    t0 = LR * math.exp(t1 + t3)
    t2 = LR * math.exp(t1 + t3 + t0)
    assert theta == pytest.approx([t0, t1, t2, t3], abs=1e-12)
    assert float(stats.factor[0]) == pytest.approx(math.exp(t1 + t3 + t0), abs=1e-12)  # what turn 2 read


def test_turn_order_that_is_no_permutation_is_a_one_line_error(registered):
    @register_turn_order("first_twice")
    def first_twice(num_turns, cfg, generator):
        """Turn 0, twice."""
        return [0, 0]

    registered.append((TURN_ORDERS, "first_twice"))
    with pytest.raises(ValueError) as err:
        turn_order(AlgorithmConfig(order="first_twice"), 2)
    assert "\n" not in str(err.value)
    assert "turn order 'first_twice' (tests/core/test_registry.py:" in str(err.value)
    assert "expected a permutation of the turns 0..1 (a list of ints), got [0, 0]" in str(err.value)


def test_registered_m_factor_is_valid_in_config_and_drives_the_weights(registered, make_batch):
    with pytest.raises(ValueError, match="m_factor='sqrt_ratio'"):
        AlgorithmConfig(m_factor="sqrt_ratio")

    @register_m_factor("sqrt_ratio")
    def sqrt_ratio(factor, ratio, cfg):
        """Half of each turn's log-ratio: ``F <- F * sqrt(pi_new / pi_old)``."""
        return factor * ratio.sqrt().to(factor.dtype)

    registered.append((M_FACTORS, "sqrt_ratio"))
    cfg = AlgorithmConfig(m_factor="sqrt_ratio", order="forward", **SEQUENTIAL)
    assert "sqrt_ratio" in choices()["m_factor"]
    theta, stats, policy, batch = sequential_run(make_batch, cfg, 3, [1.0, 2.0, -1.0])
    # by hand: theta_0 = LR; F = exp(theta_0 / 2); theta_1 = 2 LR F; F *= exp(theta_1 / 2); theta_2 = -LR F
    t0 = LR
    t1 = LR * 2.0 * math.exp(t0 / 2)
    t2 = -LR * math.exp((t0 + t1) / 2)
    assert theta == pytest.approx([t0, t1, t2], abs=1e-12)
    assert float(final_factor(policy, batch, cfg, stats)[0]) == pytest.approx(math.exp((t0 + t1 + t2) / 2), abs=1e-12)


def test_m_factor_that_uses_no_ratio_is_never_called(registered, make_batch):
    @register_m_factor("plain", uses_ratio=False)
    def plain(factor, ratio, cfg):
        """The plain advantage (never called)."""
        raise AssertionError("a rule registered with uses_ratio=False is not called")

    registered.append((M_FACTORS, "plain"))
    cfg = AlgorithmConfig(m_factor="plain", order="forward", **SEQUENTIAL)
    theta, stats, policy, batch = sequential_run(make_batch, cfg, 3, [1.0, 2.0, -1.0])
    assert theta == pytest.approx([LR, 2 * LR, -LR], abs=1e-15)  # M = A on every turn
    assert final_factor(policy, batch, cfg, stats).tolist() == [1.0]
