"""Policy losses (seeupo.core.losses) against hand-computed numbers and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from seeupo.core.losses import (
    aggregate,
    clipped_surrogate,
    kl_penalty,
    policy_objective,
    sequence_log_ratio,
    trajectory_log_ratio,
)

DT = torch.float64


def t(x):
    return torch.tensor(x, dtype=DT)


def close(actual, expected, **kw):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=DT), rtol=1e-12, atol=1e-12, **kw)


# ---------------------------------------------------------------------------------------------
# clipped_surrogate
# ---------------------------------------------------------------------------------------------

RATIOS = [0.5, 0.9, 1.1, 1.5]


def test_clipped_surrogate_positive_advantage():
    # eps = 0.2, A = +2: min(r*A, clip(r, 0.8, 1.2)*A)
    #   r=0.5: min(1.0, 1.6) = 1.0   (below the range: the unclipped, smaller term)
    #   r=0.9: min(1.8, 1.8) = 1.8 ; r=1.1: 2.2
    #   r=1.5: min(3.0, 2.4) = 2.4   (above the range: clipped)
    out = clipped_surrogate(t(RATIOS), t([2.0] * 4), 0.2, 0.2)
    close(out, [1.0, 1.8, 2.2, 2.4])


def test_clipped_surrogate_negative_advantage():
    # A = -2: r=0.5: min(-1.0, -1.6) = -1.6 (clipped) ; 0.9: -1.8 ; 1.1: -2.2 ; r=1.5: min(-3.0, -2.4) = -3.0
    out = clipped_surrogate(t(RATIOS), t([-2.0] * 4), 0.2, 0.2)
    close(out, [-1.6, -1.8, -2.2, -3.0])


def test_clipped_surrogate_asymmetric_range():
    # eps_low = 0.1, eps_high = 0.3 -> clip range [0.9, 1.3]
    # A = +1: r=0.5 -> min(0.5, 0.9) = 0.5 ; r=1.5 -> min(1.5, 1.3) = 1.3
    # A = -1: r=0.5 -> min(-0.5, -0.9) = -0.9 ; r=1.5 -> min(-1.5, -1.3) = -1.5
    out = clipped_surrogate(t([0.5, 1.5, 0.5, 1.5]), t([1.0, 1.0, -1.0, -1.0]), 0.1, 0.3)
    close(out, [0.5, 1.3, -0.9, -1.5])


def test_clipped_surrogate_gradients():
    # gradient wrt the ratio: A where the unclipped term is active, 0 where clipped
    r = t([0.5, 1.1, 1.5, 0.5, 1.1, 1.5]).requires_grad_()
    a = t([2.0, 2.0, 2.0, -2.0, -2.0, -2.0])
    clipped_surrogate(r, a, 0.2, 0.2).sum().backward()
    close(r.grad, [2.0, 2.0, 0.0, 0.0, -2.0, -2.0])


def test_dual_clip():
    # c = 3 floors a negative advantage's objective at c*A
    # A = -2, r = 5: min(-10, -2.4) = -10 -> max(-10, -6) = -6
    # A = -2, r = 1.5: -3.0 > -6 unchanged ; A = +2, r = 5: min(10, 2.4) = 2.4 unchanged
    # A = -2, r = 0.5: -1.6 unchanged
    r = t([5.0, 1.5, 5.0, 0.5])
    a = t([-2.0, -2.0, 2.0, -2.0])
    close(clipped_surrogate(r, a, 0.2, 0.2, dual_clip=3.0), [-6.0, -3.0, 2.4, -1.6])
    close(clipped_surrogate(r, a, 0.2, 0.2), [-10.0, -3.0, 2.4, -1.6])
    # the floored term has no gradient wrt the ratio
    rg = r.clone().requires_grad_()
    clipped_surrogate(rg, a, 0.2, 0.2, dual_clip=3.0).sum().backward()
    close(rg.grad, [0.0, -2.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        clipped_surrogate(r, a, 0.2, 0.2, dual_clip=1.0)


# ---------------------------------------------------------------------------------------------
# kl_penalty
# ---------------------------------------------------------------------------------------------


def test_kl_k1_k3_values():
    # logp = log 0.5, logp_ref = log 0.25
    #   k1 = log 0.5 - log 0.25 = log 2
    #   k3: log_r = log 0.25 - log 0.5 = -log 2 ; exp(log_r) - log_r - 1 = 0.5 + log 2 - 1 = log 2 - 0.5
    lp, ref = t([math.log(0.5)]), t([math.log(0.25)])
    close(kl_penalty(lp, ref, "k1"), [math.log(2.0)])
    close(kl_penalty(lp, ref, "k3"), [math.log(2.0) - 0.5])
    # reversed: log_r = log 2 ; k3 = 2 - log 2 - 1 = 1 - log 2 ; k1 = -log 2 (can be negative)
    close(kl_penalty(ref, lp, "k3"), [1.0 - math.log(2.0)])
    close(kl_penalty(ref, lp, "k1"), [-math.log(2.0)])
    # k2 = (log 2)^2 / 2 either way
    close(kl_penalty(lp, ref, "k2"), [math.log(2.0) ** 2 / 2])
    close(kl_penalty(ref, lp, "k2"), [math.log(2.0) ** 2 / 2])


def test_kl_k3_nonnegative_and_zero_at_equality():
    x = torch.linspace(-6.0, 2.0, 41, dtype=DT)
    lp, ref = torch.meshgrid(x, x, indexing="ij")
    k3 = kl_penalty(lp, ref, "k3")
    assert torch.all(k3 >= 0.0)
    assert torch.all(k3[lp != ref] > 0.0)
    close(torch.diagonal(k3), torch.zeros(41, dtype=DT))
    close(torch.diagonal(kl_penalty(lp, ref, "k1")), torch.zeros(41, dtype=DT))
    # zero gradient at equality (a valid drift)
    lpg = x.clone().requires_grad_()
    kl_penalty(lpg, x, "k3").sum().backward()
    close(lpg.grad, torch.zeros(41, dtype=DT))
    with pytest.raises(ValueError, match="'k4' is not a registered KL estimator; expected one of \\('k3', 'k1', 'k2'"):
        kl_penalty(lp, ref, "k4")


def test_a_registered_kl_estimator_is_checked_where_it_enters(registered):
    """A user's estimator joins the menu with one decorator; one that detaches its result is a one-line error."""
    from seeupo.core.config import AlgorithmConfig
    from seeupo.core.registry import KL_ESTIMATORS, register_kl_estimator
    from seeupo.validation.errors import InputError

    @register_kl_estimator("detached_k1")
    def detached_k1(logp, logp_ref):
        """k1 without its gradient."""
        return (logp - logp_ref).detach()

    registered.append((KL_ESTIMATORS, "detached_k1"))
    assert AlgorithmConfig(kl_estimator="detached_k1").kl_estimator == "detached_k1"
    lp = t([[math.log(0.5)]]).requires_grad_()
    with pytest.raises(InputError, match="detached_k1.*KL estimates that require grad"):
        kl_penalty(lp, t([[math.log(0.25)]]), "detached_k1")


# ---------------------------------------------------------------------------------------------
# sequence / trajectory ratios
# ---------------------------------------------------------------------------------------------

# row 0: 3 real tokens, diffs [0.5, 0, -1]             -> sum -0.5, mean -0.5/3
# row 1: 1 real token (diff 0.5), padding holds junk   -> sum  0.5, mean  0.5
# row 2: 1 real token (diff 0.25)                      -> sum  0.25
LOGP_NEW = [[-1.0, -2.0, -3.0], [-0.5, 5.0, 7.0], [-0.75, 3.0, 3.0]]
LOGP_OLD = [[-1.5, -2.0, -2.0], [-1.0, 0.0, 0.0], [-1.0, -9.0, -9.0]]
MASK3 = [[True, True, True], [True, False, False], [True, False, False]]


def test_sequence_log_ratio():
    m = torch.tensor(MASK3)
    close(sequence_log_ratio(t(LOGP_NEW), t(LOGP_OLD), m, length_norm=False), [-0.5, 0.5, 0.25])
    close(sequence_log_ratio(t(LOGP_NEW), t(LOGP_OLD), m, length_norm=True), [-0.5 / 3, 0.5, 0.25])


def test_sequence_log_ratio_empty_row_is_zero():
    m = torch.tensor([[False, False]])
    close(sequence_log_ratio(t([[1.0, 2.0]]), t([[0.0, 0.0]]), m, length_norm=True), [0.0])


def test_trajectory_log_ratio():
    # rows 0 and 2 belong to trajectory 0, row 1 to trajectory 1
    # traj 0: sum = -0.5 + 0.25 = -0.25 over 3 + 1 = 4 tokens -> mean -0.0625 ; traj 1: 0.5 over 1
    m = torch.tensor(MASK3)
    tid = torch.tensor([0, 1, 0])
    close(trajectory_log_ratio(t(LOGP_NEW), t(LOGP_OLD), m, tid, length_norm=False), [-0.25, 0.5, -0.25])
    close(trajectory_log_ratio(t(LOGP_NEW), t(LOGP_OLD), m, tid, length_norm=True), [-0.0625, 0.5, -0.0625])


# ---------------------------------------------------------------------------------------------
# aggregate
# ---------------------------------------------------------------------------------------------


def _agg_batch(make_batch):
    """Two instances; row 2 is a placeholder with junk values.

    row inst weight valid mask       values
     0   0    1     yes  [T, T, F]  [1, 3, 99]
     1   0    2     yes  [T, F, F]  [4, 99, 99]
     2   0    5     no   [T, T, T]  [50, 50, 50]
     3   1    1     yes  [T, T, T]  [1, 2, 3]
     4   1    3     yes  [T, T, F]  [0, 2, 99]
    """
    b = make_batch(
        traj_id=[0, 1, 2, 3, 4],
        instance=[0, 0, 0, 1, 1],
        group_id=[0, 0, 0, 1, 1],
        weight=[1.0, 2.0, 5.0, 1.0, 3.0],
        valid=[True, True, False, True, True],
        token_mask=[[True, True, False], [True, False, False], [True, True, True], [True, True, True], [True, True, False]],
    )
    values = t([[1.0, 3.0, 99.0], [4.0, 99.0, 99.0], [50.0, 50.0, 50.0], [1.0, 2.0, 3.0], [0.0, 2.0, 99.0]])
    return b, values


def test_aggregate_token_mean(make_batch):
    b, v = _agg_batch(make_batch)
    # inst 0: num = 1*(1+3) + 2*4 = 12 ; den = 1*2 + 2*1 = 4 -> 3
    # inst 1: num = 1*(1+2+3) + 3*(0+2) = 12 ; den = 1*3 + 3*2 = 9 -> 4/3
    # summed over instances: 3 + 4/3 = 13/3
    close(aggregate(v, b, "token_mean"), 13.0 / 3.0)


def test_aggregate_seq_mean_token_mean(make_batch):
    b, v = _agg_batch(make_batch)
    # inst 0: row means 2, 4 ; (1*2 + 2*4)/(1+2) = 10/3
    # inst 1: row means 2, 1 ; (1*2 + 3*1)/(1+3) = 5/4
    close(aggregate(v, b, "seq_mean_token_mean"), 10.0 / 3.0 + 5.0 / 4.0)


def test_aggregate_seq_mean_token_sum(make_batch):
    b, v = _agg_batch(make_batch)
    # inst 0: row sums 4, 4 ; (1*4 + 2*4)/3 = 4
    # inst 1: row sums 6, 2 ; (1*6 + 3*2)/4 = 3
    close(aggregate(v, b, "seq_mean_token_sum"), 7.0)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_aggregate_sums_per_instance_means(make_batch, mode):
    b, v = _agg_batch(make_batch)
    total = aggregate(v, b, mode)
    parts = []
    for inst in (0, 1):
        rows = b.instance == inst
        sub = b.select(rows).with_updates(instance=torch.zeros(int(rows.sum()), dtype=torch.long))
        parts.append(aggregate(v[rows], sub, mode))
    close(total, parts[0] + parts[1])
    # and each instance's part is its own mean: instance 1 alone is 4/3, 5/4, 3 for the three modes
    close(parts[1], {"token_mean": 4.0 / 3.0, "seq_mean_token_mean": 1.25, "seq_mean_token_sum": 3.0}[mode])


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_aggregate_excludes_placeholders_and_padding(make_batch, mode):
    b, v = _agg_batch(make_batch)
    ref = aggregate(v, b, mode)
    # changing junk slots (padding tokens and the placeholder row) or the placeholder's weight changes nothing
    junk = ~(b.token_mask & b.valid[:, None])
    v2 = torch.where(junk, torch.full_like(v, -1234.5), v)
    b2 = b.with_updates(weight=torch.where(b.valid, b.weight, torch.full_like(b.weight, 1e6)))
    close(aggregate(v2, b2, mode), ref)
    # dropping the placeholder row entirely changes nothing either
    close(aggregate(v[b.valid], b.select(b.valid), mode), ref)


def test_aggregate_weights_scale_free_within_instance(make_batch):
    b, v = _agg_batch(make_batch)
    # multiplying all weights of one instance by a constant leaves its weighted mean unchanged
    w = torch.where(b.instance == 1, b.weight * 7.0, b.weight)
    close(aggregate(v, b.with_updates(weight=w), "token_mean"), 13.0 / 3.0)


def _trajectory_rows_batch(make_batch):
    """Three trajectories of two instances, as (trajectory, turn) rows; trajectory weights 1, 2 (instance 0), 3.

    row traj inst turn weight valid  token_mask   values
     0   0    0    0     1     yes   [T, T, F]   [1, 3, 99]
     1   0    0    1     1     yes   [T, F, F]   [5, 99, 99]
     2   1    0    0     2     yes   [T, F, F]   [4, 99, 99]
     3   1    0    1     2     no    [T, T, T]   [50, 50, 50]   (a placeholder: the episode ended)
     4   2    1    0     3     yes   [T, T, T]   [1, 2, 3]
     5   2    1    1     3     yes   [T, F, F]   [7, 99, 99]
    """
    b = make_batch(
        traj_id=[0, 0, 1, 1, 2, 2], turn=[0, 1, 0, 1, 0, 1], instance=[0, 0, 0, 0, 1, 1], group_id=[0, 0, 0, 0, 1, 1],
        weight=[1.0, 1.0, 2.0, 2.0, 3.0, 3.0], valid=[True, True, True, False, True, True],
        token_mask=[[True, True, False], [True, False, False], [True, False, False], [True, True, True],
                    [True, True, True], [True, False, False]],
    )
    values = t([[1.0, 3.0, 99.0], [5.0, 99.0, 99.0], [4.0, 99.0, 99.0], [50.0, 50.0, 50.0], [1.0, 2.0, 3.0],
                [7.0, 99.0, 99.0]])
    return b, values


def test_aggregate_over_trajectory_rows_by_hand(make_batch):
    """A trajectory as one row of all its turns' tokens: trajectory 0 holds 1, 3, 5 (sum 9, 3 tokens), trajectory 1
    holds 4 (its placeholder left out), trajectory 2 holds 1, 2, 3, 7 (sum 13, 4 tokens)."""
    b, v = _trajectory_rows_batch(make_batch)
    # seq_mean_token_mean: inst 0 (1 * 9/3 + 2 * 4/1) / 3 = 11/3; inst 1: 13/4
    close(aggregate(v, b, "seq_mean_token_mean", rows="trajectory"), 11.0 / 3.0 + 13.0 / 4.0)
    # seq_mean_token_sum: inst 0 (1 * 9 + 2 * 4) / 3 = 17/3; inst 1: 13
    close(aggregate(v, b, "seq_mean_token_sum", rows="trajectory"), 17.0 / 3.0 + 13.0)
    # token_mean does not see rows: inst 0 (9 + 2 * 4) / (3 + 2) = 17/5; inst 1: 13/4
    for rows in ("turn", "trajectory"):
        close(aggregate(v, b, "token_mean", rows=rows), 17.0 / 5.0 + 13.0 / 4.0)
    # on turn rows the per-sequence modes weigh turns instead: inst 0 (1 * 2 + 1 * 5 + 2 * 4) / 4 = 15/4; inst 1
    # (3 * 2 + 3 * 7) / 6 = 9/2
    close(aggregate(v, b, "seq_mean_token_mean"), 15.0 / 4.0 + 9.0 / 2.0)
    with pytest.raises(ValueError, match="unknown aggregation rows 'episode'"):
        aggregate(v, b, "token_mean", rows="episode")


def test_trajectory_rows_need_a_simultaneous_update():
    from seeupo.core.config import preset

    assert preset("gspo", aggregation_rows="trajectory").aggregation_rows == "trajectory"
    with pytest.raises(ValueError, match="aggregation_rows='trajectory' needs schedule='simultaneous'"):
        preset("seeupo", aggregation_rows="trajectory")


def test_aggregate_unknown_mode(make_batch):
    b, v = _agg_batch(make_batch)
    with pytest.raises(ValueError):
        aggregate(v, b, "sum")


# ---------------------------------------------------------------------------------------------
# policy_objective gradients
# ---------------------------------------------------------------------------------------------

ADV = [[0.3, -1.2, 5.0], [2.0, 7.0, 7.0], [9.0, 9.0, 9.0], [-0.5, 1.5, 0.25], [1.0, -2.0, 4.0]]
# per-row advantages constant over the row (for sequence-level comparisons)
ADV_ROW = [[0.3] * 3, [2.0] * 3, [9.0] * 3, [-0.5] * 3, [1.5] * 3]


def _grad(logp, batch, adv, **kw):
    lp = logp.clone().requires_grad_()
    obj, stats = policy_objective(lp, batch, adv, **kw)
    (g,) = torch.autograd.grad(obj, lp)
    return obj, g, stats


def _reinforce_expected_grad(b, adv, mode):
    """Hand formula: d obj / d logp_ij = w_i * A_ij * mask_ij / normaliser(instance, row)."""
    # normalisers from the hand computation in the aggregate tests:
    #   token_mean:          inst 0: 4 (weighted tokens) ; inst 1: 9
    #   seq_mean_token_*:    inst 0: 3 (weighted rows)   ; inst 1: 4
    #   seq_mean_token_mean additionally divides by the row's token count (2, 1, -, 3, 2)
    den = {"token_mean": {0: 4.0, 1: 9.0}, "seq_mean_token_mean": {0: 3.0, 1: 4.0}, "seq_mean_token_sum": {0: 3.0, 1: 4.0}}[mode]
    count = [2, 1, 3, 3, 2]
    g = torch.zeros_like(adv)
    for i in range(b.num_rows):
        if not b.valid[i]:
            continue
        for j in range(adv.shape[1]):
            if b.token_mask[i, j]:
                val = float(b.weight[i]) * float(adv[i, j]) / den[int(b.instance[i])]
                if mode == "seq_mean_token_mean":
                    val /= count[i]
                g[i, j] = val
    return g


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_reinforce_gradient_is_weight_times_adv_over_normaliser(make_batch, mode):
    b, _ = _agg_batch(make_batch)
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(5, 3, generator=gen, dtype=DT)
    adv = t(ADV)
    obj, g, stats = _grad(logp, b, adv, update="reinforce", aggregation=mode)
    close(g, _reinforce_expected_grad(b, adv, mode))
    # spot check by hand, token_mean: row 1 (inst 0, w 2) token 0: 2 * 2.0 / 4 = 1.0 ; row 4 token 1: 3 * (-2)/9
    if mode == "token_mean":
        close(g[1, 0], 1.0)
        close(g[4, 1], -6.0 / 9.0)
    assert stats["clip_frac"] == 0.0


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_ppo_token_gradient_at_ratio_one_equals_reinforce(make_batch, mode):
    b, _ = _agg_batch(make_batch)
    gen = torch.Generator().manual_seed(1)
    logp_old = -torch.rand(5, 3, generator=gen, dtype=DT)
    b = b.with_updates(logp_old=logp_old)
    adv = t(ADV)
    _, g_rf, _ = _grad(logp_old, b, adv, update="reinforce", aggregation=mode)
    obj, g_ppo, stats = _grad(logp_old, b, adv, update="ppo", ratio_level="token", aggregation=mode)
    close(g_ppo, g_rf)
    assert stats["clip_frac"] == 0.0
    # at ratio 1 the surrogate equals the aggregated advantage
    close(obj, aggregate(adv, b, mode))


@pytest.mark.parametrize("scope", ["turn", "trajectory"])
@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_ppo_sequence_length_norm_gradient_at_ratio_one_equals_reinforce(make_batch, mode, scope):
    # with a row-constant advantage and the length-normalised sequence ratio:
    #   d/d logp_ij of (count_i * ratio_i * A_i) = A_i (token_mean) etc., i.e. REINFORCE's gradient
    b, _ = _agg_batch(make_batch)  # one row per trajectory, so both scopes coincide
    gen = torch.Generator().manual_seed(2)
    logp_old = -torch.rand(5, 3, generator=gen, dtype=DT)
    b = b.with_updates(logp_old=logp_old)
    adv = t(ADV_ROW)
    _, g_rf, _ = _grad(logp_old, b, adv, update="reinforce", aggregation=mode)
    _, g_seq, _ = _grad(
        logp_old, b, adv, update="ppo", ratio_level="sequence", ratio_scope=scope, length_norm=True, aggregation=mode
    )
    close(g_seq, g_rf)


def test_ppo_sequence_without_length_norm_gradient(make_batch):
    # product ratio: d ratio_i / d logp_ij = ratio_i (not ratio_i / count_i), so with token_mean the
    # gradient is w_i * count_i * A_i / den: row 0 (w 1, 2 tokens, A 0.3): 2 * 0.3 / 4 = 0.15
    #                                        row 3 (w 1, 3 tokens, A -0.5): 3 * (-0.5) / 9 = -1/6
    b, _ = _agg_batch(make_batch)
    gen = torch.Generator().manual_seed(3)
    logp_old = -torch.rand(5, 3, generator=gen, dtype=DT)
    b = b.with_updates(logp_old=logp_old)
    _, g, _ = _grad(logp_old, b, t(ADV_ROW), update="ppo", ratio_level="sequence", length_norm=False)
    close(g[0], [0.15, 0.15, 0.0])
    close(g[3], [-1.0 / 6.0] * 3)


def test_sequence_ratio_uses_row_mean_advantage(make_batch):
    # sequence level: one advantage per row, the mean over its real tokens
    # row 0 (tokens 0,1): mean(0.3, -1.2) = -0.45 ; token_mean gradient at ratio 1: 1 * -0.45 / 4 each token
    b, _ = _agg_batch(make_batch)
    logp_old = torch.zeros(5, 3, dtype=DT)
    _, g, _ = _grad(logp_old, b, t(ADV), update="ppo", ratio_level="sequence", length_norm=True)
    close(g[0], [-0.45 / 4, -0.45 / 4, 0.0])


def test_sequence_ratio_gradient_flows_to_every_token_of_the_row(make_batch):
    # perturb only token 0 of row 0; the sequence ratio (inside the clip range) passes gradient to
    # both real tokens of row 0 equally, none to its padding token nor to the placeholder row
    b, _ = _agg_batch(make_batch)
    logp_old = torch.zeros(5, 3, dtype=DT)
    b = b.with_updates(logp_old=logp_old)
    logp = logp_old.clone()
    logp[0, 0] = 0.1  # row log-ratio 0.1/2 = 0.05 -> ratio exp(0.05) ~ 1.051, inside [0.8, 1.2]
    logp[2] = 3.0  # the placeholder row: junk, must be ignored
    adv = t(ADV_ROW)
    _, g, stats = _grad(logp, b, adv, update="ppo", ratio_level="sequence", length_norm=True)
    # token_mean: obj row 0 = w * 2 tokens * ratio * A / 4 ; d/d logp_0j = 2 * ratio * A * (1/2) / 4
    r = math.exp(0.05)
    close(g[0], [r * 0.3 / 4, r * 0.3 / 4, 0.0])
    assert torch.all(g[2] == 0.0)
    assert stats["clip_frac"] == 0.0
    # token-level ratio: only the perturbed token's gradient picks up its ratio
    _, gt, _ = _grad(logp, b, adv, update="ppo", ratio_level="token")
    close(gt[0], [math.exp(0.1) * 0.3 / 4, 0.3 / 4, 0.0])


def test_trajectory_ratio_gradient_flows_to_every_row_of_the_trajectory(make_batch):
    # trajectory 0 has two rows (turns 0 and 1), trajectory 1 one row
    b = make_batch(
        traj_id=[0, 0, 1],
        turn=[0, 1, 0],
        token_mask=[[True, True], [True, False], [True, True]],
    )
    logp = torch.zeros(3, 2, dtype=DT)
    logp[1, 0] = 0.15  # only turn 1 of trajectory 0 moves: traj log-ratio 0.15 / 3 tokens = 0.05
    adv = t([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]])
    _, g, _ = _grad(logp, b, adv, update="ppo", ratio_level="sequence", ratio_scope="trajectory", length_norm=True)
    # token_mean over 5 tokens; each token of trajectory 0 holds ratio r = exp(0.05) * A = 1;
    # the trajectory's objective 3 r / 5 has d/d logp_ij = 3 * r * (1/3) / 5 = r / 5 for each of its 3 tokens
    r = math.exp(0.05)
    close(g, [[r / 5, r / 5], [r / 5, 0.0], [2.0 / 5, 2.0 / 5]])
    # turn scope: turn 0 of trajectory 0 sees ratio 1; turn 1 (one token) ratio exp(0.15) ~ 1.16 (unclipped)
    _, gt, _ = _grad(logp, b, adv, update="ppo", ratio_level="sequence", ratio_scope="turn", length_norm=True)
    close(gt[0], [1.0 / 5, 1.0 / 5])
    close(gt[1], [math.exp(0.15) / 5, 0.0])


def test_clipped_sequence_row_has_no_gradient(make_batch):
    b, _ = _agg_batch(make_batch)
    logp = torch.zeros(5, 3, dtype=DT)
    logp[0, :2] = 0.5  # row 0 ratio exp(0.5) ~ 1.65 > 1.2 with A = 0.3 > 0: clipped
    _, g, stats = _grad(logp, b, t(ADV_ROW), update="ppo", ratio_level="sequence", length_norm=True)
    assert torch.all(g[0] == 0.0)
    assert torch.all(g[1, :1] != 0.0)
    # clip fraction: the 2 tokens of row 0 (weight 1) out of instance 0's 4 weighted tokens = 0.5,
    # nothing in instance 1 -> mean over the 2 instances = 0.25
    assert stats["clip_frac"] == pytest.approx(0.25)


def test_token_clip_frac(make_batch):
    b = make_batch(traj_id=[0, 1], token_mask=[[True, True], [True, True]])
    logp = torch.tensor([[0.0, math.log(1.5)], [math.log(0.5), 0.1]], dtype=DT)
    _, _, stats = _grad(logp, b, torch.ones(2, 2, dtype=DT), update="ppo", ratio_level="token")
    # ratios 1, 1.5 (clipped), 0.5 (clipped), 1.105: 2 of 4 tokens
    assert stats["clip_frac"] == pytest.approx(0.5)


def test_placeholder_rows_get_no_gradient_in_every_mode(make_batch):
    b, _ = _agg_batch(make_batch)
    logp = torch.full((5, 3), -0.7, dtype=DT)
    logp[2] = 2.0  # junk on the placeholder
    for kw in (
        dict(update="reinforce"),
        dict(update="ppo", ratio_level="token"),
        dict(update="ppo", ratio_level="sequence", ratio_scope="turn"),
        dict(update="ppo", ratio_level="sequence", ratio_scope="trajectory"),
    ):
        for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
            _, g, _ = _grad(logp, b, t(ADV), aggregation=mode, **kw)
            assert torch.all(g[2] == 0.0), (kw, mode)
            pad = ~b.token_mask
            assert torch.all(g[pad] == 0.0), (kw, mode)


def test_policy_objective_bad_arguments(make_batch):
    b, _ = _agg_batch(make_batch)
    logp = torch.zeros(5, 3, dtype=DT)
    with pytest.raises(ValueError):
        policy_objective(logp, b, t(ADV), update="sgd")
    with pytest.raises(ValueError):
        policy_objective(logp, b, t(ADV), update="ppo", ratio_level="word")
    with pytest.raises(ValueError):
        policy_objective(logp, b, t(ADV), update="ppo", ratio_level="sequence", ratio_scope="episode")


@pytest.mark.parametrize("update, level", [("reinforce", "token"), ("ppo", "token"), ("ppo", "sequence")])
def test_non_finite_values_in_padding_do_not_leak(make_batch, update, level):
    # a language model may leave -inf in padding slots; they must not reach the objective
    b = make_batch(traj_id=[0, 1], token_mask=[[True, False], [True, True]], logp_old=[[-1.0, -math.inf], [-0.5, -0.7]])
    logp = torch.tensor([[-0.9, -math.inf], [-0.6, -0.6]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 0.0], [-1.0, -1.0]], dtype=torch.float64)
    obj, _ = policy_objective(logp, b, adv, update=update, ratio_level=level)
    assert math.isfinite(float(obj.detach()))
    obj.backward()
    assert bool(torch.isfinite(logp.grad).all())
