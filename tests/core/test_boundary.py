"""The boundary (seeupo.core.boundary): every registered function's result is checked on every call, and a
violation is one line naming the function, where it was registered, what was expected and what came back."""

from __future__ import annotations

import pickle

import pytest
import torch

from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import per_trajectory
from seeupo.core.boundary import PluginError
from seeupo.core.config import AlgorithmConfig
from seeupo.core.factor import apply_m_factor
from seeupo.core.losses import policy_objective, row_coefficients
from seeupo.core.registry import (
    ADV_ESTIMATORS, AGGREGATIONS, M_FACTORS, POLICY_LOSSES, TURN_ORDERS, register_adv_est, register_aggregation,
    register_m_factor, register_policy_loss, register_turn_order,
)
from seeupo.core.update import compute_advantages, turn_order
from seeupo.validation.errors import InputError

HERE = "tests/core/test_boundary.py:"


def _batch(make_batch):
    # trajectory 0 has two turns (the second with a padded token that holds -inf, as a language model may leave it)
    return make_batch(
        traj_id=[0, 0, 1, 2, 3], turn=[0, 1, 0, 0, 0], group_id=[0, 0, 0, 1, 1],
        token_mask=[[True, True], [True, False], [True, True], [True, True], [True, True]],
        logp_old=[[-1.0, -0.5], [-0.2, float("-inf")], [-0.3, -0.4], [-0.7, -0.1], [-0.9, -0.6]],
        traj_return=[1.0, 1.0, 0.0, 0.5, 1.0], data={"hist": torch.zeros(5, 2, dtype=torch.long)},
    )


def _centred(batch):
    r = per_trajectory(batch.traj_return, batch)
    return broadcast_to_tokens((r - r.mean())[batch.traj_id], batch)


def _numpy_write(t):
    t.numpy()[0] = 5.0  # shares the memory; torch's version counter does not see it
    return t


def _data_write(t):
    t.data[0] = 7.0  # .data has a version counter of its own
    return t


UNCOUNTED = "(bytes changed with no in-place operation torch counts, e.g. a write through .numpy() or .data)"

BROKEN_ESTIMATORS = {
    # what the estimator returns -> what the one line says
    "a list": (lambda b: _centred(b).tolist(), "expected advantages as a torch.Tensor [n, L] = [5, 2], got a list of 5"),
    "None": (lambda b: None, "expected advantages as a torch.Tensor [n, L] = [5, 2], got None"),
    "a number": (lambda b: 0.5, "got a float (0.5)"),
    "[n_traj]": (lambda b: per_trajectory(b.traj_return, b), "expected advantages of shape [n, L] = [5, 2], got shape [4]"),
    "ints": (lambda b: _centred(b).round().long(), "expected advantages of a floating dtype, got dtype torch.int64"),
    "NaN": (lambda b: _centred(b) / (b.traj_return - b.traj_return)[:, None],
            "returned non-finite advantages at 9 of 9 valid tokens (first: row 0, token 0 = "),
    "a mutated batch": (lambda b: _centred(b) + b.reward.add_(1.0)[:, None],
                        "expected its inputs left unchanged, got changed in place: batch.reward"),
    "a write through .numpy()": (lambda b: _centred(b) + 0 * _numpy_write(b.reward)[:, None],
                                 f"expected its inputs left unchanged, got changed in place: batch.reward {UNCOUNTED}"),
    "a write through .data": (lambda b: _centred(b) + 0 * _data_write(b.traj_return)[:, None],
                              f"got changed in place: batch.traj_return {UNCOUNTED}"),
    "two writes, one counted": (lambda b: _centred(b) + 0 * (_numpy_write(b.weight) + b.turn.add_(1))[:, None],
                                "got changed in place: batch.turn, batch.weight (batch.weight: bytes changed with no "
                                "in-place operation torch counts"),
    "a payload write": (lambda b: _centred(b) + 0 * _numpy_write(b.data["hist"]).sum(),
                        f"got changed in place: batch.data['hist'] {UNCOUNTED}"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_ESTIMATORS))
def test_broken_estimator_is_one_line_naming_it_and_where_it_was_registered(case, registered, make_batch):
    body, expected = BROKEN_ESTIMATORS[case]

    @register_adv_est("broken_est")
    def broken_est(batch, cfg, **_):
        """Broken on purpose."""
        return body(batch)

    registered.append((ADV_ESTIMATORS, "broken_est"))
    with pytest.raises(PluginError) as err:
        compute_advantages(_batch(make_batch), AlgorithmConfig(advantage="broken_est"))
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"advantage estimator 'broken_est' ({HERE}") and expected in text, text
    assert ("bytes changed with no in-place" in text) == (case != "a mutated batch" and "changed in place" in text)
    assert isinstance(err.value, InputError)  # the command line prints it in one line and exits with 2


def test_padding_may_hold_anything_and_a_good_estimator_passes_unchanged(registered, make_batch):
    @register_adv_est("inf_in_padding")
    def inf_in_padding(batch, cfg, **_):
        """Centred returns, -inf on padding."""
        return torch.where(batch.token_mask, _centred(batch), float("-inf"))

    registered.append((ADV_ESTIMATORS, "inf_in_padding"))
    batch = _batch(make_batch)
    adv = compute_advantages(batch, AlgorithmConfig(advantage="inf_in_padding"))
    assert torch.equal(adv[batch.token_mask], _centred(batch)[batch.token_mask])


def test_reading_through_numpy_and_data_passes_and_bytes_not_values_are_compared(registered, make_batch):
    # NaN != NaN: a comparison of values would blame this estimator for the NaN reward it only read; and a write
    # that puts back the same bytes leaves the batch as it was (the boundary compares contents, not writes)
    @register_adv_est("reader")
    def reader(batch, cfg, **_):
        """Reads every tensor through .numpy() and .data; writes one value back unchanged."""
        arr = batch.reward.numpy()
        arr[1] = arr[1]
        seen = sum(float(t.data.double().sum()) for t in (batch.traj_return, batch.weight, batch.token_mask))
        return _centred(batch) + 0.0 * seen

    registered.append((ADV_ESTIMATORS, "reader"))
    nan_reward = torch.tensor([0.0, float("nan"), 1.0, 0.0, -0.0], dtype=torch.float64)
    batch = _batch(make_batch).with_updates(reward=nan_reward)
    before = {name: getattr(batch, name).clone() for name in ("reward", "traj_return", "weight", "token_mask")}
    adv = compute_advantages(batch, AlgorithmConfig(advantage="reader"))
    assert torch.equal(adv[batch.token_mask], _centred(batch)[batch.token_mask])
    assert all(torch.equal(getattr(batch, n), t) or n == "reward" for n, t in before.items())
    assert torch.equal(batch.reward.nan_to_num(7.0), before["reward"].nan_to_num(7.0))


def test_an_exception_in_user_code_keeps_the_users_frames_only(registered, make_batch):
    def helper(batch):
        return {}["missing"]

    @register_adv_est("raising_est")
    def raising_est(batch, cfg, **_):
        """Raises in a helper."""
        return helper(batch)

    registered.append((ADV_ESTIMATORS, "raising_est"))
    with pytest.raises(PluginError) as err:
        compute_advantages(_batch(make_batch), AlgorithmConfig(advantage="raising_est"))
    text = str(err.value)
    assert text.startswith(f"advantage estimator 'raising_est' ({HERE}") and "raised KeyError: 'missing' (at " in text
    assert "in raising_est" in text and "in helper" in text and "seeupo/core" not in text  # no toolkit frame


def test_an_exception_of_a_builtin_keeps_its_traceback(make_batch):
    from seeupo.core.boundary import call_estimator

    # GAE called without its critic values fails inside the toolkit: a toolkit bug, not a plugin's
    with pytest.raises(Exception) as err:
        call_estimator(ADV_ESTIMATORS.get("gae"), _batch(make_batch), AlgorithmConfig(advantage="gae"))
    assert not isinstance(err.value, PluginError) and err.value.__traceback__ is not None


def test_the_error_crosses_process_boundaries_unchanged():
    err = PluginError("advantage estimator 'x' (est.py:3): expected a, got b")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is PluginError and str(again) == str(err)


def test_policy_loss_checks(registered, make_batch):
    batch = _batch(make_batch)
    adv = torch.ones(5, 2)
    cases = {
        "detached": (lambda lp, a: ((lp * a).detach(), None), "expected an objective that requires grad"),
        "a tensor alone": (lambda lp, a: lp * a, "expected (objective [n, L], clipped [n, L] bool or None), got a torch.float64 tensor of shape [5, 2]"),
        "a float mask": (lambda lp, a: (lp * a, torch.zeros_like(lp)), "expected clipped of dtype torch.bool, got dtype"),
        "NaN": (lambda lp, a: (lp * a / 0.0 * 0.0, None), "returned non-finite objective at 9 of 9 valid tokens"),
        "mutates adv": (lambda lp, a: (lp * a.mul_(2.0), None), "got changed in place: adv"),
        "writes adv through numpy": (lambda lp, a: (lp * _numpy_write(a), None),
                                     f"got changed in place: adv {UNCOUNTED}"),
    }
    for case, (body, expected) in cases.items():
        register_policy_loss("broken_loss", surrogate=False)(lambda lp, b, a, cfg, body=body: body(lp, a))
        try:
            logp = batch.logp_old.clone().requires_grad_(True)
            with pytest.raises(PluginError) as err:
                policy_objective(logp, batch, adv.clone(), update="broken_loss")
            text = str(err.value)
            assert text.startswith(f"policy loss 'broken_loss' ({HERE}") and expected in text, (case, text)
        finally:
            POLICY_LOSSES.remove("broken_loss")
    # the built-in losses pass, with -inf in the padding of both log-probabilities
    for update in ("ppo", "reinforce"):
        logp = batch.logp_old.clone().requires_grad_(True)
        objective, _ = policy_objective(logp, batch, adv, update=update)
        objective.backward()
        assert bool(torch.isfinite(logp.grad).all())


def test_aggregation_turn_order_and_m_factor_checks(registered, make_batch):
    batch = _batch(make_batch)
    register_aggregation("one_number")(lambda n_tokens, weight: (weight.sum(), weight))
    registered.append((AGGREGATIONS, "one_number"))
    with pytest.raises(PluginError, match=r"loss aggregation 'one_number' \(.*\): expected per_row of shape \[n\] = \[5\], got shape \[\]"):
        row_coefficients(batch, "one_number")

    register_turn_order("as_tensor")(lambda num_turns, cfg, generator: torch.arange(num_turns).flip(0))
    register_turn_order("floats")(lambda num_turns, cfg, generator: [1.0, 0.0])
    registered += [(TURN_ORDERS, "as_tensor"), (TURN_ORDERS, "floats")]
    assert turn_order(AlgorithmConfig(order="as_tensor"), 3) == [2, 1, 0]  # a 1-D integer tensor is a permutation too
    with pytest.raises(PluginError, match=r"turn order 'floats' .*expected a permutation of the turns 0..1 \(a list of ints\), got \[1.0, 0.0\]"):
        turn_order(AlgorithmConfig(order="floats"), 2)

    register_m_factor("nan_factor")(lambda factor, ratio, cfg: factor * float("nan"))
    register_m_factor("list_factor")(lambda factor, ratio, cfg: factor.tolist())
    registered += [(M_FACTORS, "nan_factor"), (M_FACTORS, "list_factor")]
    factor, ratio = torch.ones(4), torch.full((2,), 1.5)
    turn0 = batch.select(torch.tensor([0, 2]))
    with pytest.raises(PluginError, match=r"M factor 'nan_factor' .*non-finite factor at 2 of 2 trajectories"):
        apply_m_factor(factor, turn0, ratio, AlgorithmConfig(m_factor="nan_factor"))
    with pytest.raises(PluginError, match=r"M factor 'list_factor' .*got a list of 2"):
        apply_m_factor(factor, turn0, ratio, AlgorithmConfig(m_factor="list_factor"))
    assert apply_m_factor(factor, turn0, ratio, AlgorithmConfig()).tolist() == [1.5, 1.5, 1.0, 1.0]  # happo, built in


def test_registry_options_are_checked_and_builtins_know_where_they_live():
    with pytest.raises(TypeError, match=r"a policy loss has no option 'surogate'; its options: \['surrogate'\]"):
        register_policy_loss("typo", surogate=False)
    assert ADV_ESTIMATORS.get("grae").where.startswith("seeupo/core/builtins.py:")
    assert ADV_ESTIMATORS.get("grae").builtin


def test_non_finite_inputs_are_not_the_functions_fault(make_batch):
    # a broken reward (NaN) gives NaN advantages and a NaN objective: the update skips such steps and the trainer
    # stops after optim.max_non_finite of them, so the boundary does not blame GRAE or the loss
    batch = _batch(make_batch).with_updates(traj_return=torch.tensor([float("nan"), float("nan"), 0.0, 0.5, 1.0]))
    adv = compute_advantages(batch, AlgorithmConfig(advantage="grae", group_size=2))
    assert bool(adv[0].isnan().all())
    logp = batch.logp_old.clone().requires_grad_(True)
    objective, _ = policy_objective(logp, batch, adv, update="ppo")
    assert objective.isnan()


def test_the_exact_tabular_engine_stops_an_estimator_that_writes_through_numpy(registered):
    from seeupo.core import preset
    from seeupo.tabular.problems import random_sequential_bandit
    from seeupo.tabular.train import RunConfig, run

    @register_adv_est("numpy_writer")
    def numpy_writer(batch, cfg, **_):
        """GRPO-like centred returns, after overwriting the rewards through numpy."""
        _numpy_write(batch.reward)
        return _centred(batch)

    registered.append((ADV_ESTIMATORS, "numpy_writer"))
    problem = random_sequential_bandit(2, (2, 2), generator=torch.Generator().manual_seed(0))
    with pytest.raises(PluginError) as err:
        run(problem, preset("grpo", advantage="numpy_writer"), RunConfig(mode="exact", iterations=1))
    assert str(err.value).startswith(f"advantage estimator 'numpy_writer' ({HERE}")
    assert str(err.value).endswith(f"got changed in place: batch.reward {UNCOUNTED}"), str(err.value)
