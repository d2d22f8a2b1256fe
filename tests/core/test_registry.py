"""The registries: one decorated function adds an estimator, a loss or an aggregation that the whole core uses."""

from __future__ import annotations

import pytest
import torch

from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import SampleBatch, per_trajectory
from seeupo.core.config import AlgorithmConfig, choices
from seeupo.core.losses import aggregate
from seeupo.core.registry import (
    ADV_ESTIMATORS,
    AGGREGATIONS,
    POLICY_LOSSES,
    register_adv_est,
    register_aggregation,
    register_policy_loss,
)
from seeupo.core.update import compute_advantages, policy_update
from seeupo.validation import InputError, dataclass_from_dict

DT = torch.float64


@pytest.fixture
def registered():
    """Names registered by a test, unregistered afterwards so that the built-in menu stays as shipped."""
    added: list[tuple[object, str]] = []
    yield added
    for registry, name in added:
        registry.remove(name)


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
    assert c["order"] == ("reverse", "forward", "random", "custom")  # the non-registry choices read the Literal
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
    assert ADV_ESTIMATORS.get("grae") is before


@pytest.mark.parametrize("field, registry", [("advantage", ADV_ESTIMATORS), ("update", POLICY_LOSSES),
                                             ("aggregation", AGGREGATIONS)])
def test_unknown_name_is_one_line_listing_the_registered_names(field, registry):
    with pytest.raises(ValueError) as err:
        AlgorithmConfig(**{field: "nope"})
    message = str(err.value)
    assert "\n" not in message and f"AlgorithmConfig.{field}='nope'" in message
    assert all(name in message for name in registry.names())

