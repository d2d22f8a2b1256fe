"""Does REINFORCE with GRAE at ``gamma < 1`` converge to a policy that is not optimal for ``J_gamma``?

Finding: **no, not in the exact, tabular setting; discounting is not a source of bias for
mean-centred or leave-one-out GRAE.** The reason is exact, not asymptotic:

GRAE broadcasts the trajectory's return *discounted from the start*, ``R = sum_t gamma^t r_t``,
to every turn. For the turn-``t`` sample, the rewards before ``t`` are fixed by ``h_t`` and
``E[grad log pi(a_t | h_t) | h_t] = 0`` removes them; the rest is
``gamma^t (r_t + gamma r_{t+1} + ...)``, whose conditional mean given ``(h_t, a_t)`` is
``gamma^t Q_t^gamma(h_t, a_t)``. The group-mates are independent of the trajectory, so the
baseline drops out too, and::

    E[ sum_{t alive} grad log pi(a_t | h_t) A_i ] = (1 - 1/G) sum_t gamma^t sum_h d_t(h) sum_a grad pi(a|h) Q_t^gamma(h, a)
                                                  = (1 - 1/G) grad J_gamma           (mean centring; factor 1 for leave-one-out)

which is the policy-gradient theorem for the discounted objective *with* its ``gamma^t``
state weighting (the factor commonly dropped by "return-to-go" estimators; Nota & Thomas 2020).
Episodes of varying length change nothing: a dead turn has no sample, and the engine's
``token_mean`` aggregation divides by the constant ``E[#turns]``, so the engine's exact
REINFORCE gradient is ``(1 - 1/G) grad J_gamma / E[#turns]`` (:func:`engine_gradient_check`,
exact to rounding). Expected REINFORCE-GRAE is therefore gradient ascent on ``J_gamma``; with
independent softmax parameters on a tree MDP every history keeps positive probability and it
converges to the ``J_gamma``-optimal value (Agarwal et al. 2021, asymptotic convergence of
softmax policy gradient). :func:`symbolic_gradient_identity` proves the identity in sympy on a
2-turn tree with symbolic ``gamma``, rewards and early-termination probability.

Search (:func:`search_discounted_counterexample`): exact-mode engine runs of ``preset('rloo')``
and mean-centred GRAE + REINFORCE on random tree MDPs with early termination, per-turn rewards
and ``gamma in {0.5, 0.9}`` end within about ``1e-8`` of ``J*_gamma`` (after 200 Adam steps,
``lr = 0.1``); the returned "worst" instance is the one with the largest remaining gap, and
that gap is optimisation error, not a biased limit.

What does break convergence, with or without discounting, is the **group std** with
non-binary returns: the signal's conditional mean is not affine in ``Q``
(:mod:`seeupo.theory.grae_moments`). :func:`group_std_contrast` runs
``preset('grpo', update='reinforce', group_size=2)`` on the single-turn instance of
:func:`seeupo.theory.surrogate_bound.group_std_decrease_instance`: the expected signal favours
the worse action for *every* policy (``E[X | a=0] - E[X | a=1] = 0.4/sqrt(2)``), and the run
converges to ``J = 1/4`` while ``J* = 3/10``. Other ways to get a non-``J_gamma``-optimal limit
are outside the question (an undiscounted return on a discounted objective optimises the
other objective; shared parameters add local optima).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp
import torch

from seeupo.core.config import AlgorithmConfig, preset
from seeupo.core.losses import policy_objective
from seeupo.core.update import compute_advantages
from seeupo.tabular.exact import evaluate, optimal, reach_probabilities
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import TreeMDP, random_tree_mdp
from seeupo.tabular.rollout import exact_batch
from seeupo.tabular.train import RunConfig, run

Tensor = torch.Tensor


# ---------------------------------------------------------------------------------------------
# symbolic identity
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradientIdentity:
    """The expected REINFORCE-GRAE update vs ``grad J_gamma`` on a symbolic 2-turn tree.

    Tree: two actions per turn; after ``a_1`` the reward is ``r_<a1>`` and the episode ends with
    probability ``q_<a1>``; otherwise ``a_2`` gives ``s_<a1><a2>``; the return is
    ``r + gamma s``. Softmax logits ``theta_<a1>`` and ``phi_<a1><a2>`` with probabilities
    ``pi_<a1>`` and ``pi_<a1><a2>``.

    ``grae_minus_gradient``: ``E[sum_t grad log pi_t (1 - 1/G)(R - V)] - (1 - 1/G) grad J_gamma``
    per parameter (all simplify to 0). ``return_to_go_ratio``: the same expectation with the
    turn-``t`` signal replaced by the return-to-go from ``t`` (no ``gamma^t``), divided by
    ``grad J_gamma``, for the turn-2 logits: ``1/gamma`` (a per-turn rescaling, so not the
    gradient of ``J_gamma`` unless ``gamma = 1``).
    """

    parameters: tuple[sp.Symbol, ...]
    objective: sp.Expr
    grae_minus_gradient: tuple[sp.Expr, ...]
    return_to_go_ratio: tuple[sp.Expr, ...]


def symbolic_gradient_identity() -> GradientIdentity:
    """Prove ``E[REINFORCE-GRAE update] = (1 - 1/G) grad J_gamma`` on a symbolic 2-turn tree (:class:`GradientIdentity`).

    Softmax derivatives are applied through their Jacobian, ``d pi_k / d theta_j = pi_k (delta_kj - pi_j)``
    and ``d log pi_k / d theta_j = delta_kj - pi_j``, with the probabilities as symbols
    (``pi_1 = 1 - pi_0`` substituted at the end), which keeps the algebra polynomial.
    """
    gamma = sp.Symbol("gamma", positive=True)
    g = sp.Symbol("G", positive=True)
    p1 = [sp.Symbol(f"pi_{i}", positive=True) for i in range(2)]
    p2 = [[sp.Symbol(f"pi_{i}{j}", positive=True) for j in range(2)] for i in range(2)]
    theta = [sp.Symbol(f"theta_{i}", real=True) for i in range(2)]
    phi = [[sp.Symbol(f"phi_{i}{j}", real=True) for j in range(2)] for i in range(2)]
    r = [sp.Symbol(f"r_{i}", real=True) for i in range(2)]
    s = [[sp.Symbol(f"s_{i}{j}", real=True) for j in range(2)] for i in range(2)]
    q = [sp.Symbol(f"q_{i}", positive=True) for i in range(2)]
    # each parameter: the softmax it belongs to (probability symbols) and its index in it
    groups = {theta[j]: (p1, j) for j in range(2)}
    groups.update({phi[i][j]: (p2[i], j) for i in range(2) for j in range(2)})

    def d_prob(expr: sp.Expr, x: sp.Symbol) -> sp.Expr:
        """d expr / d x through the softmax of x's group (expr polynomial in the probabilities)."""
        probs, j = groups[x]
        return sum(sp.diff(expr, pk) * pk * ((1 if k == j else 0) - probs[j]) for k, pk in enumerate(probs))

    def d_log(prob: sp.Symbol, x: sp.Symbol) -> sp.Expr:
        probs, j = groups[x]
        if prob not in probs:
            return sp.Integer(0)
        return (1 if probs.index(prob) == j else 0) - probs[j]

    # trajectories (probability, return, action probabilities of the alive turns, turn-2 reward or None)
    trajs = []
    for i in range(2):
        trajs.append((p1[i] * q[i], r[i], [p1[i]], None))
        for j in range(2):
            trajs.append((p1[i] * (1 - q[i]) * p2[i][j], r[i] + gamma * s[i][j], [p1[i], p2[i][j]], s[i][j]))
    objective = sum(p * ret for p, ret, _, _ in trajs)
    normalise = {p1[1]: 1 - p1[0], p2[0][1]: 1 - p2[0][0], p2[1][1]: 1 - p2[1][0]}
    params = (*theta, *phi[0], *phi[1])
    c = 1 - 1 / g
    diffs, ratios = [], []
    for x in params:
        grad_true = d_prob(objective, x)
        update = sum(p * sum(d_log(a, x) for a in acts) * c * (ret - objective) for p, ret, acts, _ in trajs)
        diffs.append(sp.simplify(sp.expand((update - c * grad_true).subs(normalise))))
        if x in phi[0] or x in phi[1]:
            # return-to-go from turn 2 is s (no gamma^1); turn-2 logits only score turn-2 samples
            rtg = sum(p * d_log(acts[1], x) * s2 for p, _, acts, s2 in trajs if s2 is not None)
            ratios.append(sp.simplify(sp.factor((rtg / grad_true).subs(normalise))))
    return GradientIdentity(params, objective.subs(normalise), tuple(diffs), tuple(ratios))


# ---------------------------------------------------------------------------------------------
# engine cross-check of the identity
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradientCheck:
    """The engine's exact REINFORCE gradient vs ``grad J_gamma`` (autograd through :func:`seeupo.tabular.exact.evaluate`).

    ``engine`` and ``true`` are per-parameter-tensor gradients; ``expected_scale`` ``[I]`` is
    ``c / E[#turns]`` with ``c = 1 - 1/G`` (mean) or ``1`` (leave-one-out); ``max_error`` is
    ``max |engine - expected_scale * true|``.
    """

    engine: tuple[Tensor, ...]
    true: tuple[Tensor, ...]
    expected_scale: Tensor
    max_error: float


def engine_gradient_check(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig) -> GradientCheck:
    """Compare the engine's REINFORCE-GRAE gradient on the exact batch with ``grad J_gamma`` (:class:`GradientCheck`).

    ``cfg`` must be GRAE without scaling (``grae_scale="none"``), ``update="reinforce"`` and the
    ``token_mean`` aggregation (the presets ``rloo`` and ``rloo`` with ``grae_center="mean"``).
    """
    if cfg.advantage != "grae" or cfg.grae_scale != "none" or cfg.grae_center == "none":
        raise ValueError("engine_gradient_check needs centred, unscaled GRAE")
    batch, stats = exact_batch(problem, policy, cfg)
    adv = compute_advantages(batch, cfg, group_stats=stats)
    objective, _ = policy_objective(policy.token_logps(batch), batch, adv, update="reinforce", aggregation=cfg.aggregation)
    params = list(policy.parameters())
    engine = torch.autograd.grad(objective, params)
    j = evaluate(problem, policy.action_probs()).J
    true = torch.autograd.grad(j.sum(), params)
    with torch.no_grad():
        expected_turns = sum(d.sum(-1) for d in reach_probabilities(problem, policy.action_probs()))
    c = 1.0 - 1.0 / cfg.group_size if cfg.grae_center == "mean" else 1.0
    scale = c / expected_turns
    err = max(
        float((e - scale.reshape(-1, *([1] * (e.dim() - 1))) * t).abs().max()) for e, t in zip(engine, true)
    )
    return GradientCheck(tuple(engine), tuple(true), scale, err)


# ---------------------------------------------------------------------------------------------
# limits of engine runs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LimitResult:
    """Measured end point of an exact-mode engine run, per instance.

    ``J`` the final value, ``J_star`` the optimum (backward induction, same ``gamma``), ``gap``
    their difference, ``greedy_optimal`` whether at every history the final policy reaches
    with probability > 1e-3 its most likely action is optimal (``Q*`` within 1e-9 of ``V*``).
    """

    J: Tensor
    J_star: Tensor
    gap: Tensor
    greedy_optimal: Tensor
    probs: list[Tensor]


def measure_limit(problem: TreeMDP, cfg: AlgorithmConfig, *, iterations: int = 200, lr: float = 0.1) -> LimitResult:
    """Run ``cfg`` in exact mode with Adam for ``iterations`` steps and measure the end point (:class:`LimitResult`)."""
    hist = run(problem, cfg, RunConfig(mode="exact", update="gradient", iterations=iterations, lr=lr))
    with torch.no_grad():
        probs = hist.policy.action_probs()
    opt = optimal(problem)
    reach = reach_probabilities(problem, probs)
    greedy_ok = torch.ones(problem.num_instances, dtype=torch.bool)
    for t in range(problem.num_turns):
        greedy = probs[t].argmax(-1, keepdim=True)
        q_greedy = opt.Q[t].gather(-1, greedy).squeeze(-1)
        ok = (q_greedy >= opt.V[t] - 1e-9) | (reach[t] <= 1e-3)
        greedy_ok &= ok.all(-1)
    return LimitResult(hist.J[-1], hist.J_star, hist.J_star - hist.J[-1], greedy_ok, probs)


@dataclass(frozen=True)
class SearchResult:
    """Result of :func:`search_discounted_counterexample`.

    ``gaps[name]`` ``[num_instances]`` per algorithm; ``worst`` the ``(name, index)`` with the
    largest gap; ``instance`` that single instance; ``limit`` its :class:`LimitResult`;
    ``counterexample_found`` whether any gap exceeded ``tolerance``.
    """

    problem: TreeMDP
    gaps: dict[str, Tensor]
    worst: tuple[str, int]
    instance: TreeMDP
    limit: LimitResult
    tolerance: float
    counterexample_found: bool


DISCOUNT_ALGORITHMS: dict[str, AlgorithmConfig] = {
    "rloo": preset("rloo"),
    "grae_mean_reinforce": preset("rloo", grae_center="mean", group_size=3),
}


def search_discounted_counterexample(
    *,
    num_instances: int = 6,
    gamma: float = 0.5,
    seed: int = 0,
    iterations: int = 200,
    lr: float = 0.1,
    tolerance: float = 1e-4,
) -> SearchResult:
    """Search random tree MDPs (``gamma < 1``, early termination, per-turn rewards) for a non-optimal limit.

    Instances: ``random_tree_mdp(num_instances, (2, 2), (2, 2), terminate_prob=0.4,
    per_turn_rewards=True, gamma=gamma, reward_levels=3)`` seeded by ``seed``; algorithms
    :data:`DISCOUNT_ALGORITHMS` (REINFORCE with leave-one-out and mean-centred GRAE) in exact
    mode. Returns the measured gaps and the worst instance (:class:`SearchResult`).
    """
    if not 0.0 < gamma < 1.0:
        raise ValueError(f"the search is about gamma < 1, got {gamma}")
    problem = random_tree_mdp(
        num_instances, (2, 2), (2, 2), terminate_prob=0.4, per_turn_rewards=True, gamma=gamma, reward_levels=3,
        generator=torch.Generator().manual_seed(seed),
    )
    gaps: dict[str, Tensor] = {}
    limits: dict[str, LimitResult] = {}
    for name, cfg in DISCOUNT_ALGORITHMS.items():
        limits[name] = measure_limit(problem, cfg, iterations=iterations, lr=lr)
        gaps[name] = limits[name].gap
    name, index = max(((n, int(g.argmax())) for n, g in gaps.items()), key=lambda x: float(gaps[x[0]][x[1]]))
    worst = problem.instance(index)
    limit = measure_limit(worst, DISCOUNT_ALGORITHMS[name], iterations=iterations, lr=lr)
    found = any(bool((g > tolerance).any()) for g in gaps.values())
    return SearchResult(problem, gaps, (name, index), worst, limit, tolerance, found)


def group_std_contrast(*, iterations: int = 200, lr: float = 0.1) -> LimitResult:
    """REINFORCE with group-std GRAE (``G = 2``) converging to a non-optimal policy (module docstring).

    Runs ``preset('grpo', update='reinforce', group_size=2)`` in exact mode on
    :func:`seeupo.theory.surrogate_bound.group_std_decrease_instance`; the limit plays action 0
    (``J -> 1/4`` while ``J* = 3/10``).
    """
    from seeupo.theory.surrogate_bound import group_std_decrease_instance

    problem, _ = group_std_decrease_instance()
    return measure_limit(problem, preset("grpo", update="reinforce", group_size=2), iterations=iterations, lr=lr)
