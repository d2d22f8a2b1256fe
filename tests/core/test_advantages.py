"""Advantage estimators (seeupo.core.advantages) against numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from seeupo.core.advantages import batch_zscore, gae, gae_for_batch, grae, grae_from_group_stats

DT = torch.float64


def t(x):
    return torch.tensor(x, dtype=DT)


def close(actual, expected, **kw):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=DT), rtol=1e-12, atol=1e-12, **kw)


# ---------------------------------------------------------------------------------------------
# grae_from_group_stats
# ---------------------------------------------------------------------------------------------

# Group A: returns R = [1, 3, 5], G = 3.
#   sum = 9, sumsq = 1 + 9 + 25 = 35, mean = 3
#   unbiased var = ((1-3)^2 + (3-3)^2 + (5-3)^2) / (3-1) = (4 + 0 + 4) / 2 = 4  -> std = 2
R_A = [1.0, 3.0, 5.0]
SUM_A, SUMSQ_A = 9.0, 35.0


def _stats(returns, s, ss, g, **kw):
    r = t(returns)
    return grae_from_group_stats(r, torch.full_like(r, s), torch.full_like(r, ss), g, **kw)


def test_grae_mean_centring_by_hand():
    # A_i = R_i - 3  ->  [1-3, 3-3, 5-3] = [-2, 0, 2]
    close(_stats(R_A, SUM_A, SUMSQ_A, 3, center="mean"), [-2.0, 0.0, 2.0])


def test_grae_mean_centring_uneven_group():
    # R = [1, 2, 6], sum 9, mean 3 -> [-2, -1, 3]
    close(_stats([1.0, 2.0, 6.0], 9.0, 41.0, 3, center="mean"), [-2.0, -1.0, 3.0])


def test_grae_leave_one_out_by_hand():
    # R = [1, 2, 6]: A_i = R_i - (9 - R_i) / 2
    #   1 - 8/2 = -3 ; 2 - 7/2 = -1.5 ; 6 - 3/2 = 4.5
    close(_stats([1.0, 2.0, 6.0], 9.0, 41.0, 3, center="loo"), [-3.0, -1.5, 4.5])


def test_grae_loo_is_g_over_g_minus_1_times_mean_centring():
    # R_i - (S - R_i)/(G-1) = (G R_i - S)/(G-1) = G/(G-1) (R_i - S/G); for R_A: 3/2 * [-2, 0, 2] = [-3, 0, 3]
    close(_stats(R_A, SUM_A, SUMSQ_A, 3, center="loo"), [-3.0, 0.0, 3.0])


def test_grae_center_none_returns_a_copy():
    r = t(R_A)
    out = grae_from_group_stats(r, torch.full_like(r, SUM_A), torch.full_like(r, SUMSQ_A), 3, center="none")
    close(out, R_A)
    out[0] = 100.0
    assert r[0].item() == 1.0  # not an alias of the input


def test_grae_group_std_unbiased_with_eps():
    # std = 2 (unbiased, see above); eps = 0.5 -> divide by 2.5
    #   mean-centred [-2, 0, 2] / 2.5 = [-0.8, 0, 0.8]
    close(_stats(R_A, SUM_A, SUMSQ_A, 3, center="mean", group_std=True, eps=0.5), [-0.8, 0.0, 0.8])
    # eps = 0: exactly [-1, 0, 1]
    close(_stats(R_A, SUM_A, SUMSQ_A, 3, center="mean", group_std=True, eps=0.0), [-1.0, 0.0, 1.0])
    # matches torch.std (unbiased) as GRPO computes it
    r = t(R_A)
    close(_stats(R_A, SUM_A, SUMSQ_A, 3, group_std=True, eps=1e-6), (r - r.mean()) / (r.std() + 1e-6))


def test_grae_group_std_uneven_group():
    # R = [1, 2, 6]: deviations [-2, -1, 3], squares 4 + 1 + 9 = 14, unbiased var 14/2 = 7
    #   A = [-2, -1, 3] / sqrt(7)
    s7 = math.sqrt(7.0)
    close(_stats([1.0, 2.0, 6.0], 9.0, 41.0, 3, group_std=True, eps=0.0), [-2 / s7, -1 / s7, 3 / s7])


def test_grae_loo_with_group_std():
    # loo [-3, 0, 3] / (2 + 0.5) = [-1.2, 0, 1.2]
    close(_stats(R_A, SUM_A, SUMSQ_A, 3, center="loo", group_std=True, eps=0.5), [-1.2, 0.0, 1.2])


def test_grae_from_stats_errors():
    with pytest.raises(ValueError):
        _stats(R_A, SUM_A, SUMSQ_A, 1)
    with pytest.raises(ValueError):
        _stats(R_A, SUM_A, SUMSQ_A, 3, center="median")


# ---------------------------------------------------------------------------------------------
# batch_zscore
# ---------------------------------------------------------------------------------------------


def test_batch_zscore_weighted_per_instance_by_hand():
    # instance 0: A = [1, 2], w = [1, 3]
    #   mean = (1*1 + 3*2)/4 = 7/4 ; centred = [-0.75, 0.25]
    #   var = (1*0.5625 + 3*0.0625)/4 = 0.75/4 = 0.1875 = 3/16 ; std = sqrt(3)/4
    #   z = [-0.75 * 4/sqrt3, 0.25 * 4/sqrt3] = [-sqrt3, 1/sqrt3]
    # instance 1: A = [3, 4], w = [1, 1]
    #   mean 3.5 ; centred [-0.5, 0.5] ; population var 0.25 ; std 0.5 ; z = [-1, 1]
    adv = t([1.0, 2.0, 3.0, 4.0])
    inst = torch.tensor([0, 0, 1, 1])
    w = t([1.0, 3.0, 1.0, 1.0])
    s3 = math.sqrt(3.0)
    close(batch_zscore(adv, inst, w, eps=0.0), [-s3, 1 / s3, -1.0, 1.0])


def test_batch_zscore_eps_and_population_std():
    # instance 1 alone with eps 0.5: [-0.5, 0.5] / (0.5 + 0.5) = [-0.5, 0.5]
    adv = t([3.0, 4.0])
    out = batch_zscore(adv, torch.tensor([0, 0]), t([1.0, 1.0]), eps=0.5)
    close(out, [-0.5, 0.5])


def test_batch_zscore_interleaved_instances():
    # same data as the hand test, rows interleaved: the statistics follow the instance ids
    adv = t([3.0, 1.0, 4.0, 2.0])
    inst = torch.tensor([1, 0, 1, 0])
    w = t([1.0, 1.0, 1.0, 3.0])
    s3 = math.sqrt(3.0)
    close(batch_zscore(adv, inst, w, eps=0.0), [-1.0, -s3, 1.0, 1 / s3])


def test_batch_zscore_integer_weights_equal_repetition():
    # weight 3 on a value = that value repeated three times with unit weights
    adv_w = batch_zscore(t([1.0, 2.0]), torch.tensor([0, 0]), t([1.0, 3.0]), eps=0.0)
    adv_rep = batch_zscore(t([1.0, 2.0, 2.0, 2.0]), torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=DT), eps=0.0)
    close(adv_w, adv_rep[:2])


# ---------------------------------------------------------------------------------------------
# grae on a batch
# ---------------------------------------------------------------------------------------------


def _grae_batch(make_batch, weight_traj=None):
    """Two instances, one group of G = 3 each, two turns, L = 2, rows in a scrambled order.

    instance 0 / group 0: trajectories 0, 1, 2 with returns [1, 3, 5]
    instance 1 / group 1: trajectories 3, 4, 5 with returns [0, 4, 2]
    Trajectory 2 and 5 end after turn 0: their turn-1 rows are placeholders (valid=False).
    """
    returns = {0: 1.0, 1: 3.0, 2: 5.0, 3: 0.0, 4: 4.0, 5: 2.0}
    rows = [  # (traj, turn, valid, token mask)
        (4, 1, True, [True, False]),
        (0, 0, True, [True, True]),
        (2, 1, False, [True, True]),
        (5, 0, True, [True, False]),
        (1, 1, True, [True, True]),
        (3, 0, True, [True, True]),
        (0, 1, True, [True, False]),
        (5, 1, False, [True, True]),
        (2, 0, True, [True, True]),
        (1, 0, True, [True, True]),
        (3, 1, True, [True, True]),
        (4, 0, True, [True, True]),
    ]
    wt = weight_traj or {k: 1.0 for k in returns}
    return make_batch(
        traj_id=[r[0] for r in rows],
        turn=[r[1] for r in rows],
        valid=[r[2] for r in rows],
        token_mask=[r[3] for r in rows],
        group_id=[0 if r[0] < 3 else 1 for r in rows],
        instance=[0 if r[0] < 3 else 1 for r in rows],
        traj_return=[returns[r[0]] for r in rows],
        weight=[wt[r[0]] for r in rows],
    )


def _expected_tokens(batch, per_traj):
    """Broadcast a per-trajectory value over real tokens of valid rows (the expectation side)."""
    out = torch.zeros(batch.num_rows, batch.token_mask.shape[1], dtype=DT)
    for i in range(batch.num_rows):
        if batch.valid[i]:
            for j in range(batch.token_mask.shape[1]):
                if batch.token_mask[i, j]:
                    out[i, j] = per_traj[int(batch.traj_id[i])]
    return out


def test_grae_batch_mean(make_batch):
    b = _grae_batch(make_batch)
    # group 0: [1,3,5] - 3 = [-2, 0, 2] ; group 1: [0,4,2] - 2 = [-2, 2, 0]
    per_traj = {0: -2.0, 1: 0.0, 2: 2.0, 3: -2.0, 4: 2.0, 5: 0.0}
    out = grae(b, group_size=3, center="mean")
    close(out, _expected_tokens(b, per_traj))
    # explicit spot checks: row 0 is traj 4 turn 1 with mask [T, F] -> [2, 0]
    close(out[0], [2.0, 0.0])
    # row 2 is a placeholder (traj 2, turn 1) -> 0 although traj 2's advantage is 2
    close(out[2], [0.0, 0.0])


def test_grae_batch_loo(make_batch):
    b = _grae_batch(make_batch)
    # group 0: loo = 3/2 * [-2, 0, 2] = [-3, 0, 3] ; group 1: 3/2 * [-2, 2, 0] = [-3, 3, 0]
    per_traj = {0: -3.0, 1: 0.0, 2: 3.0, 3: -3.0, 4: 3.0, 5: 0.0}
    close(grae(b, group_size=3, center="loo"), _expected_tokens(b, per_traj))


def test_grae_batch_group_std(make_batch):
    b = _grae_batch(make_batch)
    # group 0: std 2 (above) -> [-2, 0, 2] / 2.5 = [-0.8, 0, 0.8]
    # group 1: [0,4,2], mean 2, deviations [-2, 2, 0], unbiased var (4+4+0)/2 = 4, std 2
    #          -> [-2, 2, 0] / 2.5 = [-0.8, 0.8, 0]
    per_traj = {0: -0.8, 1: 0.0, 2: 0.8, 3: -0.8, 4: 0.8, 5: 0.0}
    close(grae(b, group_size=3, scale="group_std", eps=0.5), _expected_tokens(b, per_traj))


def test_grae_batch_zscore_unit_weights(make_batch):
    b = _grae_batch(make_batch)
    # instance 0: mean-centred [-2, 0, 2]; batch mean 0; population var (4+0+4)/3 = 8/3
    #   z = [-2, 0, 2] / sqrt(8/3) = [-sqrt(3/2), 0, sqrt(3/2)]
    # instance 1: [-2, 2, 0], same statistics -> [-sqrt(3/2), sqrt(3/2), 0]
    # (statistics are over trajectories, not rows: the placeholder/turn count does not matter)
    z = math.sqrt(1.5)
    per_traj = {0: -z, 1: 0.0, 2: z, 3: -z, 4: z, 5: 0.0}
    close(grae(b, group_size=3, scale="batch_std", eps=0.0), _expected_tokens(b, per_traj))


def test_grae_batch_zscore_weighted(make_batch):
    b = _grae_batch(make_batch, weight_traj={0: 1.0, 1: 1.0, 2: 2.0, 3: 1.0, 4: 1.0, 5: 1.0})
    # instance 0: A = [-2, 0, 2], w = [1, 1, 2]
    #   mean = (-2 + 0 + 4)/4 = 0.5 ; centred [-2.5, -0.5, 1.5]
    #   var = (6.25 + 0.25 + 2*2.25)/4 = 11/4 ; std = sqrt(2.75)
    # instance 1 unchanged: [-sqrt(1.5), sqrt(1.5), 0]
    s = math.sqrt(2.75)
    z = math.sqrt(1.5)
    per_traj = {0: -2.5 / s, 1: -0.5 / s, 2: 1.5 / s, 3: -z, 4: z, 5: 0.0}
    close(grae(b, group_size=3, scale="batch_std", eps=0.0), _expected_tokens(b, per_traj))


def test_grae_batch_clamp_after_scaling(make_batch):
    b = _grae_batch(make_batch)
    # mean-centred [-2, 0, 2] clamped to [-1.5, 1.5] -> [-1.5, 0, 1.5]
    per_traj = {0: -1.5, 1: 0.0, 2: 1.5, 3: -1.5, 4: 1.5, 5: 0.0}
    close(grae(b, group_size=3, clamp=1.5), _expected_tokens(b, per_traj))
    # group std first ([-0.8, 0, 0.8]), then clamp at 1.0: unchanged
    # (clamping before scaling would give [-1, 0, 1] / 2.5 = [-0.4, 0, 0.4])
    per_traj = {0: -0.8, 1: 0.0, 2: 0.8, 3: -0.8, 4: 0.8, 5: 0.0}
    close(grae(b, group_size=3, scale="group_std", clamp=1.0, eps=0.5), _expected_tokens(b, per_traj))
    # ... and at 0.5: [-0.5, 0, 0.5]
    per_traj = {0: -0.5, 1: 0.0, 2: 0.5, 3: -0.5, 4: 0.5, 5: 0.0}
    close(grae(b, group_size=3, scale="group_std", clamp=0.5, eps=0.5), _expected_tokens(b, per_traj))


def test_grae_placeholders_and_padding_are_zero(make_batch):
    b = _grae_batch(make_batch)
    out = grae(b, group_size=3, center="none")  # returns themselves, all non-zero except traj 3
    pad = ~(b.token_mask & b.valid[:, None])
    assert bool(pad.any())
    assert torch.all(out[pad] == 0.0)
    assert torch.all(out[~b.valid] == 0.0)
    # the real tokens carry the return
    assert out[1, 0].item() == 1.0 and out[1, 1].item() == 1.0  # traj 0 turn 0


def test_grae_group_size_mismatch_raises(make_batch):
    b = _grae_batch(make_batch)
    with pytest.raises(ValueError):
        grae(b, group_size=2)
    with pytest.raises(ValueError):
        grae(b, group_size=4)
    # unequal groups: move trajectory 2 into group 1 -> sizes 2 and 4
    gid = torch.where(b.traj_id == 2, torch.ones_like(b.group_id), b.group_id)
    with pytest.raises(ValueError):
        grae(b.with_updates(group_id=gid), group_size=3)


def test_grae_unknown_scale_raises(make_batch):
    with pytest.raises(ValueError):
        grae(_grae_batch(make_batch), group_size=3, scale="minmax")


def test_grae_external_group_stats(make_batch):
    # exact mode: per-trajectory (sum, sumsq) supplied; the batch's own groups are ignored
    b = make_batch(traj_id=[0, 1], token_mask=[[True], [True]], traj_return=[1.0, 3.0], group_id=[0, 0])
    # G = 4 (the batch holds only 2 trajectories: no size check on this path)
    # traj 0: sum 10 -> mean 2.5 -> 1 - 2.5 = -1.5 ; traj 1: sum 6 -> mean 1.5 -> 3 - 1.5 = 1.5
    out = grae(b, group_size=4, group_stats=(t([10.0, 6.0]), t([30.0, 14.0])))
    close(out, [[-1.5], [1.5]])
    # loo: traj 0: 1 - (10 - 1)/3 = -2 ; traj 1: 3 - (6 - 3)/3 = 2
    out = grae(b, group_size=4, center="loo", group_stats=(t([10.0, 6.0]), t([30.0, 14.0])))
    close(out, [[-2.0], [2.0]])


# ---------------------------------------------------------------------------------------------
# gae
# ---------------------------------------------------------------------------------------------

# Two sequences, the second padded after 2 steps (garbage 100 in the padded slot).
REW = [[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]]
VAL = [[0.5, 1.0, 1.5], [2.0, 1.0, 100.0]]
MASK = [[True, True, True], [True, True, False]]


def _gae(gamma, lam):
    return gae(t(REW), t(VAL), torch.tensor(MASK), gamma, lam)


def test_gae_by_hand():
    # gamma = 0.9, lambda = 0.8, gamma*lambda = 0.72 ; V after the last real step is 0
    # row 0: d2 = 3 + 0.9*0   - 1.5 = 1.5
    #        d1 = 2 + 0.9*1.5 - 1.0 = 2.35
    #        d0 = 1 + 0.9*1.0 - 0.5 = 1.4
    #        A2 = 1.5 ; A1 = 2.35 + 0.72*1.5 = 3.43 ; A0 = 1.4 + 0.72*3.43 = 3.8696
    # row 1: d1 = 5 + 0 - 1.0 = 4.0 ; d0 = 4 + 0.9*1.0 - 2.0 = 2.9
    #        A1 = 4.0 ; A0 = 2.9 + 0.72*4.0 = 5.78 ; padding 0
    adv, target = _gae(0.9, 0.8)
    close(adv, [[3.8696, 3.43, 1.5], [5.78, 4.0, 0.0]])
    # value targets = A + V on real steps, 0 on padding
    close(target, [[4.3696, 4.43, 3.0], [7.78, 5.0, 0.0]])


def test_gae_lambda_zero_is_td_error():
    # A_s = delta_s: row 0 [1.4, 2.35, 1.5], row 1 [2.9, 4.0, 0]
    adv, _ = _gae(0.9, 0.0)
    close(adv, [[1.4, 2.35, 1.5], [2.9, 4.0, 0.0]])


def test_gae_lambda_one_is_mc_return_minus_value():
    # gamma = 0.9: returns-to-go
    #   row 0: G2 = 3 ; G1 = 2 + 0.9*3 = 4.7 ; G0 = 1 + 0.9*4.7 = 5.23
    #          A = [5.23 - 0.5, 4.7 - 1.0, 3 - 1.5] = [4.73, 3.7, 1.5]
    #   row 1: G1 = 5 ; G0 = 4 + 0.9*5 = 8.5 ; A = [8.5 - 2, 5 - 1, 0] = [6.5, 4.0, 0]
    adv, target = _gae(0.9, 1.0)
    close(adv, [[4.73, 3.7, 1.5], [6.5, 4.0, 0.0]])
    # the value target is then the Monte Carlo return itself
    close(target, [[5.23, 4.7, 3.0], [8.5, 5.0, 0.0]])


def test_gae_gamma_one_lambda_one_undiscounted():
    # row 0: returns-to-go [6, 5, 3] - V [0.5, 1, 1.5] = [5.5, 4, 1.5]
    # row 1: [9, 5] - [2, 1] = [7, 4]
    adv, _ = _gae(1.0, 1.0)
    close(adv, [[5.5, 4.0, 1.5], [7.0, 4.0, 0.0]])


def _gae_reference(rewards, values, lengths, gamma, lam):
    """Direct sum A_s = sum_l (gamma*lam)^l delta_{s+l} over the real prefix, unrolled in Python."""
    B, S = len(rewards), len(rewards[0])
    out = [[0.0] * S for _ in range(B)]
    for b in range(B):
        n = lengths[b]
        v = list(values[b][:n]) + [0.0]  # V after the end is 0
        delta = [rewards[b][s] + gamma * v[s + 1] - v[s] for s in range(n)]
        for s in range(n):
            out[b][s] = sum((gamma * lam) ** l * delta[s + l] for l in range(n - s))
    return out


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 1.0), (0.7, 0.3), (0.0, 0.5)])
def test_gae_matches_unrolled_reference(gamma, lam):
    gen = torch.Generator().manual_seed(7)
    B, S = 5, 6
    rewards = torch.randn(B, S, generator=gen, dtype=DT)
    values = torch.randn(B, S, generator=gen, dtype=DT)
    lengths = [6, 1, 3, 0, 5]
    mask = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
    adv, target = gae(rewards, values, mask, gamma, lam)
    expected = _gae_reference(rewards.tolist(), values.tolist(), lengths, gamma, lam)
    torch.testing.assert_close(adv, t(expected), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(target, (t(expected) + values) * mask, rtol=1e-12, atol=1e-12)
    assert torch.all(adv[~mask] == 0.0)


# ---------------------------------------------------------------------------------------------
# gae_for_batch
# ---------------------------------------------------------------------------------------------


def _gae_batch(make_batch):
    """traj 0: turns 0 and 1; traj 1: turn 0, then a placeholder for turn 1. L = 2. Rows scrambled.

    row  traj turn valid  mask     reward  values (state before each token)
     0    1    1   no     [T, T]   7 (junk) [9, 9] (junk)
     1    0    1   yes    [T, T]   2        [1.0, 0.75]
     2    1    0   yes    [T, T]   3        [2.0, 1.5]
     3    0    0   yes    [T, F]   1        [0.5, 100 (padding, junk)]
    """
    b = make_batch(
        traj_id=[1, 0, 1, 0],
        turn=[1, 1, 0, 0],
        valid=[False, True, True, True],
        token_mask=[[True, True], [True, True], [True, True], [True, False]],
        reward=[7.0, 2.0, 3.0, 1.0],
        group_id=[0, 0, 0, 0],
    )
    values = t([[9.0, 9.0], [1.0, 0.75], [2.0, 1.5], [0.5, 100.0]])
    return b, values


def test_gae_for_batch_turn_level(make_batch):
    b, values = _gae_batch(make_batch)
    # one step per turn, V = values[:, 0]; gamma = lambda = 0.5 (gamma*lambda = 0.25)
    # traj 0: d1 = 2 + 0       - 1.0 = 1.0 ; d0 = 1 + 0.5*1.0 - 0.5 = 1.0
    #         A1 = 1.0 ; A0 = 1.0 + 0.25*1.0 = 1.25
    # traj 1: d0 = 3 + 0 - 2.0 = 1.0 (turn 1 is a placeholder: the episode ended) ; A0 = 1.0
    out = gae_for_batch(b, values, gamma=0.5, lam=0.5, token_level=False)
    close(out, [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.25, 0.0]])


def test_gae_for_batch_token_level(make_batch):
    b, values = _gae_batch(make_batch)
    # one step per real token, the turn's reward on its last real token; padding squeezed out
    # traj 0 steps: s0 = (turn 0, tok 0) r=1 V=0.5 ; s1 = (turn 1, tok 0) r=0 V=1.0 ; s2 = (turn 1, tok 1) r=2 V=0.75
    #   d2 = 2 + 0        - 0.75 = 1.25                 A2 = 1.25
    #   d1 = 0 + 0.5*0.75 - 1.0  = -0.625               A1 = -0.625 + 0.25*1.25 = -0.3125
    #   d0 = 1 + 0.5*1.0  - 0.5  = 1.0                  A0 = 1.0 + 0.25*(-0.3125) = 0.921875
    # traj 1 steps: s0 = (turn 0, tok 0) r=0 V=2.0 ; s1 = (turn 0, tok 1) r=3 V=1.5
    #   d1 = 3 - 1.5 = 1.5                              A1 = 1.5
    #   d0 = 0 + 0.5*1.5 - 2.0 = -1.25                  A0 = -1.25 + 0.25*1.5 = -0.875
    out = gae_for_batch(b, values, gamma=0.5, lam=0.5, token_level=True)
    close(out, [[0.0, 0.0], [-0.3125, 1.25], [-0.875, 1.5], [0.921875, 0.0]])


def test_gae_for_batch_token_level_lambda_one_gamma_one(make_batch):
    b, values = _gae_batch(make_batch)
    # undiscounted MC: every token's advantage = (rewards still to come in the trajectory) - V
    # traj 0: turn 0 tok 0: 1 + 2 - 0.5 = 2.5 ; turn 1: 2 - 1.0 = 1.0, 2 - 0.75 = 1.25
    # traj 1: 3 - 2.0 = 1.0, 3 - 1.5 = 1.5
    out = gae_for_batch(b, values, gamma=1.0, lam=1.0, token_level=True)
    close(out, [[0.0, 0.0], [1.0, 1.25], [1.0, 1.5], [2.5, 0.0]])


def test_gae_for_batch_row_order_irrelevant(make_batch):
    b, values = _gae_batch(make_batch)
    perm = torch.tensor([2, 0, 3, 1])
    for token_level in (False, True):
        ref = gae_for_batch(b, values, gamma=0.9, lam=0.7, token_level=token_level)
        out = gae_for_batch(b.select(perm), values[perm], gamma=0.9, lam=0.7, token_level=token_level)
        close(out, ref[perm])


def test_reinforce_pp_is_the_return_to_go_whitened_over_the_batch_by_hand(make_batch):
    """REINFORCE++ (OpenRLHF's ``reinforce``): no baseline; each token carries its turn's return-to-go, whitened over
    every valid token. Trajectory A earns 1 then 2 (returns-to-go 3 and 2, one token each); B earns 0 and stops after
    turn 0 (its turn-1 row a placeholder); C's single turn has 2 tokens and earns 1. Tokens: 3, 2, 0, 1, 1: mean 7/5,
    population variance (64 + 9 + 49 + 4 + 4) / 125 = 26/25."""
    from seeupo.core.advantages import reinforce_pp

    mask = [[True, False]] * 4 + [[True, True]] * 2
    batch = make_batch(traj_id=[0, 0, 1, 1, 2, 2], turn=[0, 1, 0, 1, 0, 1], token_mask=mask,
                       reward=[1.0, 2.0, 0.0, 0.0, 1.0, 0.0], valid=[True, True, True, False, True, False])
    adv = reinforce_pp(batch, gamma=1.0, eps=0.0)
    sd = math.sqrt(26 / 25)
    close(adv[:, 0], t([8 / 5 / sd, 3 / 5 / sd, -7 / 5 / sd, 0.0, -2 / 5 / sd, 0.0]))
    close(adv[4, 1], t(-2 / 5 / sd))  # every token of C's turn
    assert adv[0, 1] == 0 and adv[3].abs().sum() == 0  # padding, placeholder
    discounted = reinforce_pp(batch, gamma=0.5, eps=0.0)  # A's turn 0: 1 + 0.5 * 2 = 2
    mean = (2 + 2 + 0 + 1 + 1) / 5
    var = ((2 - mean) ** 2 * 2 + mean**2 + (1 - mean) ** 2 * 2) / 5
    close(discounted[0, 0], t((2 - mean) / math.sqrt(var)))
