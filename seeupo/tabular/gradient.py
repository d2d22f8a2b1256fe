"""The gradient verdict: where an algorithm's expected update points, and where it leads.

Two exact measurements on a tabular problem with independent parameters (a table of logits per
turn, docs/method.md §1), at two levels (:data:`LEVELS`): the advantage **estimator** alone, and the
algorithm's whole **update** (:func:`update_direction`: the estimator, the policy loss's derivative
at ratio 1, the aggregation's per-row and per-token weights, a loss's own turn weights, the ``M``
factor's first-step value and the schedule's order), the direction the first optimizer step of a
training run takes in expectation:

* **direction** (:func:`gradient_directions`): the expected update direction at a policy,
  ``g = E[sum_t sum_j A_tj grad log pi(y_j | h_t, y_<j)]``, computed from the exact-mode batch
  (every path weighted by its probability, a group estimator's group-mates enumerated:
  :func:`seeupo.tabular.rollout.exact_advantages`), against the true policy gradient
  ``grad J`` (autograd through the exact ``J``), per turn (the turn's parameters) and whole.
  This is the direction of the policy-gradient estimator itself, before the loss's aggregation
  and clipping: at the sampling policy every ratio is 1, so a clipped surrogate's first
  gradient is this one, rescaled per row by the aggregation's positive coefficients (the
  same for every row of a turn in these problems).
* **fixed point** (:func:`plain_ascent`): plain exact ascent ``theta <- theta + lr * g(theta)``
  with the expected direction recomputed at every step (no optimizer, no clipping, no
  sampling noise): where the estimator or the update itself leads, apart from any optimizer's
  choices.

Where the update's verdict is worse than its estimator's, :func:`biasing_part` names the part of
the update that biases it: the first of :data:`UPDATE_PARTS` whose neutral choice gives the
update the estimator's verdict back.

:func:`classify` turns a direction into one of :data:`DIRECTIONS`. Tolerances are set by float64
noise: the quantities are sums of at most millions of float64 products (relative error near
1e-13), so :data:`REL_TOL` = 1e-9 leaves four orders of magnitude on each side; a cosine within
:data:`REL_TOL` of 1 is parallel.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig, registered_functions
from seeupo.core.losses import row_coefficients
from seeupo.core.registry import adv_estimator
from seeupo.tabular.exact import evaluate, optimal
from seeupo.tabular.policies import TabularPolicy, uniform_probs
from seeupo.tabular.problems import DTYPE, TreeMDP
from seeupo.tabular.rollout import exact_advantages, enumerate_paths

Tensor = torch.Tensor

#: Relative tolerance of every comparison here (module docstring: float64 noise).
REL_TOL = 1e-9

#: The levels at which a direction is read: the advantage estimator alone, or the algorithm's whole update.
LEVELS = ("estimator", "update")

#: The parts of an update after its estimator, each with its neutral choice (the one that passes the estimator's
#: direction through unchanged, up to a positive factor per instance): a plain policy-gradient loss, every token
#: summed with its row's weight, no ``M`` factor, every turn at once.
UPDATE_PARTS: dict[str, dict[str, str]] = {
    "loss": {"update": "reinforce"},
    "aggregation": {"aggregation": "seq_mean_token_sum"},
    "M factor": {"m_factor": "none"},
    "schedule": {"schedule": "simultaneous"},
}

#: The direction verdicts, best first (a set of cases reports its worst).
DIRECTIONS: dict[str, str] = {
    "unbiased": "the expected update is a positive multiple of the policy gradient (every turn by the same factor)",
    "unbiased per turn up to a positive scale": "each turn's expected update is a positive multiple of that turn's "
                                                "policy gradient, by factors that differ between turns",
    "biased but uphill": "the expected update is not parallel to the policy gradient, but no turn's points downhill",
    "no expected signal": "the expected update is zero (within tolerance) where the policy gradient is not",
    "points downhill": "some turn's expected update (or the whole) has a negative inner product with the policy gradient: "
                       "an update of that turn alone lowers J to first order",
}
#: A case at a stationary policy (``grad J = 0`` within tolerance) says nothing about a direction.
STATIONARY = "stationary start"

#: Where plain exact ascent with the expected direction ends.
FIXED_POINTS: dict[str, str] = {
    "reaches J*": "plain exact ascent ended within gap_tol of J*",
    "stops below J*": "plain exact ascent stopped improving short of J* (its expected update vanishes or points "
                      "away from J* there)",
    "still improving": "plain exact ascent was short of J* and still closing the gap when its steps ran out "
                       "(inconclusive)",
}


def _turn_parameters(policy: TabularPolicy) -> list[list[Tensor]]:
    """The independent policy's logit tables grouped by turn."""
    if policy.parameterization != "independent":
        raise ValueError("the gradient verdict needs the 'independent' parameterization (a turn's own parameters)")
    tables = list(policy.logits)
    out, k = [], 0
    for _, length in policy.tokens:
        out.append(tables[k: k + length])
        k += length
    return out


def _per_instance(grads: list[Tensor | None], params: list[Tensor]) -> Tensor:
    """``[I, P]``: the gradients of one turn's tables, flattened per instance (``None`` as zeros)."""
    return torch.cat([(torch.zeros_like(p) if g is None else g).flatten(1) for g, p in zip(grads, params)], 1)


def turn_gradients(value: Tensor, policy: TabularPolicy) -> list[Tensor]:
    """The gradient of the scalar ``value`` (a sum over instances) per turn, ``[I, P_t]`` (the turn's logits flattened
    per instance; an independent policy's instances have their own parameters)."""
    turns = _turn_parameters(policy)
    flat = [p for ps in turns for p in ps]
    grads = torch.autograd.grad(value, flat, allow_unused=True)
    out, k = [], 0
    for ps in turns:
        out.append(_per_instance(list(grads[k: k + len(ps)]), ps))
        k += len(ps)
    return out


def policy_gradient(problem: TreeMDP, policy: TabularPolicy) -> list[Tensor]:
    """``grad J`` per turn, ``[I, P_t]`` (the turn's logits flattened per instance), by autograd through the exact ``J``."""
    return turn_gradients(evaluate(problem, policy.action_probs()).J.sum(), policy)


def expected_direction(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig) -> tuple[list[Tensor], Tensor]:
    """The expected update direction of ``cfg``'s estimator per turn, ``[I, P_t]``, and its scale ``[I]``.

    ``g = sum over exact rows of weight * sum_j A_j grad log pi(y_j)`` (module docstring). The
    scale is ``E[sum_t sum_j |A_tj|]``, the size its terms could have had: a direction whose norm
    is below :data:`REL_TOL` times it carries no expected signal.
    """
    batch, adv = exact_advantages(problem, policy, cfg)
    turns = _turn_parameters(policy)
    flat = [p for ps in turns for p in ps]
    real = (batch.token_mask & batch.valid[:, None]).to(DTYPE)
    logp = policy.token_logps(batch)
    weighted = batch.weight[:, None] * adv.detach().to(DTYPE) * real
    grads = torch.autograd.grad((weighted * logp).sum(), flat, allow_unused=True)
    out, k = [], 0
    for ps in turns:
        out.append(_per_instance(list(grads[k: k + len(ps)]), ps))
        k += len(ps)
    scale = torch.zeros(problem.num_instances, dtype=DTYPE).index_add_(0, batch.instance, weighted.abs().sum(1))
    return out, scale


class _Recorder(torch.optim.Optimizer):
    """An optimizer that moves nothing: each step adds the parameters' gradients of the loss, negated (the
    objective's ascent direction), to ``ascent[p]``. Since nothing moves, every step of an update, the
    turns of a sequential sweep included, is taken at the starting parameters: every ratio is 1."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        super().__init__(params, {})
        self.ascent = {p: torch.zeros_like(p) for group in self.param_groups for p in group["params"]}

    @torch.no_grad()
    def step(self, closure: object = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.ascent[p] -= p.grad


def _first_step(policy: TabularPolicy, batch: SampleBatch, adv: Tensor, cfg: AlgorithmConfig,
                logp_ref: Tensor | None = None) -> dict[Tensor, Tensor]:
    """The ascent direction of ``cfg``'s update on ``batch`` at ``policy``, per parameter (:class:`_Recorder`);
    a KL term in the loss is kept only where ``logp_ref`` (the reference's log-probabilities of the rows) is given."""
    from seeupo.core.update import UpdateSettings, policy_update

    recorder = _Recorder(list(policy.parameters()))
    kept = cfg.kl_coef if logp_ref is not None else 0.0
    first = cfg.replace(epochs=1, minibatches=1, equal_budget=False, kl_coef=kept)
    policy_update(policy, recorder, batch, adv.detach(), first,
                  UpdateSettings(generator=torch.Generator().manual_seed(0), logp_ref=logp_ref))
    return recorder.ascent


def first_step_per_turn(policy: TabularPolicy, batch: SampleBatch, adv: Tensor, cfg: AlgorithmConfig,
                        logp_ref: Tensor | None = None) -> list[Tensor]:
    """The ascent direction of ``cfg``'s update on ``batch`` (:func:`_first_step`) per turn, ``[I, P_t]``."""
    ascent = _first_step(policy, batch, adv, cfg, logp_ref)
    return [_per_instance([ascent[p] for p in ps], ps) for ps in _turn_parameters(policy)]


def linear_in_advantage(cfg: AlgorithmConfig) -> bool:
    """Whether the first step of ``cfg``'s update is linear in the advantages: odd and 2-homogeneous (``g(-A) = -g(A)``,
    ``g(2A) = 2 g(A)``) on a probe batch (a stop-or-continue problem, a non-uniform policy, advantages of both signs
    on both turns). A clipped surrogate at ratio 1 is; a loss that keeps only negative advantages is not. Only then
    does the expected advantage of each path (a group estimator's closed form) give the expected first step.
    Measured once per configuration and registered functions (a loss registered again under its name is probed
    again)."""
    return _linear_in_advantage(cfg, registered_functions(cfg))


@functools.lru_cache(maxsize=256)
def _linear_in_advantage(cfg: AlgorithmConfig, _functions: tuple[object, ...]) -> bool:
    from seeupo.tabular.problems import stop_or_continue
    from seeupo.tabular.rollout import exact_batch

    problem = stop_or_continue(0.6, 0.3, (0.5, 0.0))
    policy = TabularPolicy(problem)
    policy.set_action_probs([torch.tensor([[[0.3, 0.7]]], dtype=DTYPE), torch.tensor([[[0.5, 0.5], [0.8, 0.2]]], dtype=DTYPE)])
    batch, _ = exact_batch(problem, policy, cfg.replace(advantage="grae", grae_scale="none", group_size=2))
    pattern = torch.linspace(-1.0, 1.3, batch.num_rows, dtype=DTYPE)[:, None] * batch.token_mask.to(DTYPE)
    steps = [_first_step(policy, batch, k * pattern, cfg) for k in (1.0, -1.0, 2.0)]
    one = torch.cat([g.flatten() for g in steps[0].values()])
    size = float(one.abs().max()) or 1.0
    return all(torch.allclose(torch.cat([g.flatten() for g in other.values()]), k * one, rtol=0, atol=1e-12 * size)
               for other, k in ((steps[1], -1.0), (steps[2], 2.0)))


def update_direction(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig,
                     behaviour: TabularPolicy | None = None,
                     reference: TabularPolicy | None = None) -> tuple[list[Tensor], Tensor]:
    """The expected first step of ``cfg``'s whole update per turn, ``[I, P_t]``, and its scale ``[I]``.

    The algorithm's own update (:func:`seeupo.core.update.policy_update`: its policy loss,
    aggregation, ``M`` factor and schedule, the code a training run executes) on the exact-mode
    batch, one optimizer step per turn of a sequential sweep (one for all turns otherwise), with an
    optimizer that records each step's ascent direction and moves nothing: every ratio is 1, so
    each turn's step reads the ``M`` factor's first-step value, the derivative of the loss at ratio
    1 and the aggregation's weights of the whole batch (a trajectory's own length included, where a
    loss reads it). Gradient-norm clipping is left out, and so is a KL term unless ``reference`` is
    given (at the reference itself its gradient is zero). A group estimator's closed form (each path's expected advantage) gives the
    expected step only for an update linear in the advantages (:func:`linear_in_advantage`); for
    another the group-mates are enumerated (:func:`seeupo.tabular.rollout.exact_group_batch`), so
    that each group draw's advantage goes through the loss. The scale is ``sum_rows |c_i| sum_j
    |A_ij|`` (``c`` the aggregation's row coefficients): the size its terms could have had.
    ``behaviour``: the rows are drawn from it instead of ``policy`` (off policy), and ``cfg.correction``
    reweights them (:mod:`seeupo.tabular.behaviour`). ``reference``: the KL term is kept, against this frozen
    policy, where it sits (``cfg.kl_placement``: the penalised rewards feed the advantages, or the reference's
    log-probabilities the loss; :mod:`seeupo.tabular.kl`).
    """
    from seeupo.tabular.kl import kl_reward_problem

    estimator = adv_estimator(cfg.advantage)
    closed_form = not (estimator.needs_group_stats and estimator.group_stats_closed_form) or linear_in_advantage(cfg)
    kl = reference is not None and cfg.kl_coef > 0.0
    learned = kl_reward_problem(problem, policy, reference, cfg) if kl and cfg.kl_placement == "reward" else problem
    batch, adv = exact_advantages(learned, policy, cfg, closed_form=closed_form, behaviour=behaviour)
    logp_ref = None
    if kl and cfg.kl_placement != "reward":
        with torch.no_grad():
            logp_ref = reference.token_logps(batch)  # type: ignore[union-attr]
    out = first_step_per_turn(policy, batch, adv, cfg, logp_ref)
    real = (batch.token_mask & batch.valid[:, None]).to(DTYPE)
    coef = row_coefficients(batch, cfg.aggregation, cfg.aggregation_rows).to(DTYPE).abs()
    terms = coef * (adv.detach().to(DTYPE).abs() * real).sum(1)
    scale = torch.zeros(problem.num_instances, dtype=DTYPE).index_add_(0, batch.instance, terms)
    return out, scale


def direction(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig, level: str) -> tuple[list[Tensor], Tensor]:
    """:func:`expected_direction` (``level="estimator"``) or :func:`update_direction` (``"update"``)."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; expected one of {LEVELS}")
    return (expected_direction if level == "estimator" else update_direction)(problem, policy, cfg)


@dataclass
class Direction:
    """The direction verdict of one instance at one policy, with its numbers.

    verdict: one of :data:`DIRECTIONS`, or :data:`STATIONARY`.
    cosine: the whole expected update against ``grad J`` (``nan`` where either is zero).
    turn_cosines: the same per turn (``nan`` where either is zero).
    turn_scales: per turn ``|g_t| / |grad J_t|`` (``nan`` where ``grad J_t`` is zero).
    downhill_turn: the turn whose expected update points most downhill (``None`` if none does).
    """

    verdict: str
    cosine: float
    turn_cosines: list[float]
    turn_scales: list[float]
    downhill_turn: int | None = None


def _cosine(a: Tensor, b: Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    return float((a * b).sum()) / (na * nb) if na > 0 and nb > 0 else math.nan


def classify(expected: list[Tensor], true: list[Tensor], expected_scale: float, value_scale: float) -> Direction:
    """The verdict of one instance's expected update (per turn, flat ``[P_t]``) against ``grad J`` (the same shapes).

    ``expected_scale``: :func:`expected_direction`'s scale; ``value_scale``: the largest ``|return|``,
    the scale of ``grad J``. Norms below :data:`REL_TOL` times their scale are zero.
    """
    g_tol, j_tol = REL_TOL * max(expected_scale, 1e-300), REL_TOL * max(value_scale, 1e-300)
    g = [x if float(x.norm()) > g_tol else torch.zeros_like(x) for x in expected]
    j = [x if float(x.norm()) > j_tol else torch.zeros_like(x) for x in true]
    whole_g, whole_j = torch.cat(g), torch.cat(j)
    cosines = [_cosine(a, b) for a, b in zip(g, j)]
    scales = [float(a.norm()) / float(b.norm()) if float(b.norm()) > 0 else math.nan for a, b in zip(g, j)]
    cos = _cosine(whole_g, whole_j)
    negative = [(c, t) for t, c in enumerate(cosines) if c < -REL_TOL]
    downhill = min(negative)[1] if negative else None

    def parallel(a: Tensor, b: Tensor) -> bool:
        both_zero = float(a.norm()) == 0 and float(b.norm()) == 0
        return both_zero or _cosine(a, b) >= 1 - REL_TOL

    if float(whole_j.norm()) == 0:
        verdict = STATIONARY
    elif negative or cos < -REL_TOL:
        verdict = "points downhill"
    elif float(whole_g.norm()) == 0:
        verdict = "no expected signal"
    elif parallel(whole_g, whole_j):
        verdict = "unbiased"
    elif all(parallel(a, b) for a, b in zip(g, j)):
        verdict = "unbiased per turn up to a positive scale"
    else:
        verdict = "biased but uphill"
    return Direction(verdict, cos, cosines, scales, downhill)


def value_scale(problem: TreeMDP) -> Tensor:
    """``[I]``: the largest ``|return|`` of any path, the scale of ``J`` and of ``grad J``."""
    paths = enumerate_paths(problem, uniform_probs(problem))
    discount = problem.gamma ** torch.arange(problem.num_turns, dtype=DTYPE)
    return (paths.reward * discount).sum(-1).abs().amax(-1)


def gradient_directions(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig,
                        level: str = "estimator") -> list[Direction]:
    """The direction verdict of ``cfg``'s estimator (or, ``level="update"``, its whole update) on every instance of
    ``problem`` at ``policy``."""
    expected, scale = direction(problem, policy, cfg, level)
    true = policy_gradient(problem, policy)
    values = value_scale(problem)
    return [classify([e[i] for e in expected], [t[i] for t in true], float(scale[i]), float(values[i]))
            for i in range(problem.num_instances)]


def biasing_part(problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig, instance: int) -> str:
    """The part of ``cfg``'s update that makes its direction on ``instance`` worse than its estimator's: ``"estimator"``
    when the estimator's own verdict is as bad, else the first of :data:`UPDATE_PARTS` whose neutral choice alone gives
    the update a better verdict, else ``"several parts"`` (no single one does)."""
    one = problem.instance(instance)
    start = [p[instance: instance + 1].detach() for p in policy.action_probs()]

    def verdict(config: AlgorithmConfig, level: str) -> str:
        candidate = TabularPolicy(one)
        candidate.set_action_probs(start)
        return gradient_directions(one, candidate, config, level)[0].verdict

    order = list(DIRECTIONS) + [STATIONARY]
    own, update = order.index(verdict(cfg, "estimator")), order.index(verdict(cfg, "update"))
    if own >= update:
        return "estimator"
    for part, neutral in UPDATE_PARTS.items():
        if any(getattr(cfg, k) != v for k, v in neutral.items()) and order.index(verdict(cfg.replace(**neutral), "update")) < update:
            return part
    return "several parts"


def worst(verdicts: list[str]) -> str:
    """The worst of some direction verdicts (:data:`DIRECTIONS` is ordered best first); stationary ones are ignored."""
    order = list(DIRECTIONS)
    judged = [v for v in verdicts if v != STATIONARY]
    return max(judged, key=order.index) if judged else STATIONARY


@dataclass
class Ascent:
    """Plain exact ascent with the expected direction, per instance (:func:`plain_ascent`).

    J: ``[steps + 1, I]`` the exact ``J`` along the way; J_star: ``[I]``; verdict: per instance,
    one of :data:`FIXED_POINTS`; probs: the policy it ended at (per turn ``[I, N_t, A_t]``);
    steps: the steps taken (fewer than asked when every instance's update vanished).
    """

    J: Tensor
    J_star: Tensor
    verdict: list[str]
    probs: list[Tensor] = field(repr=False)
    steps: int
    lr: float
    gap_tol: float


def plain_ascent(problem: TreeMDP, cfg: AlgorithmConfig, *, start: list[Tensor] | None = None, lr: float = 10.0,
                 steps: int = 300, gap_tol: float = 1e-2, stall_ratio: float = 0.05, level: str = "estimator") -> Ascent:
    """Plain exact ascent ``theta <- theta + lr * c * g(theta)`` from ``start`` (default: uniform), ``g`` the expected
    direction of the estimator or of the whole update (``level``, :func:`direction`).

    ``c`` is one positive number per instance, fixed at the start: 1 for the estimator, and for the
    update the ratio of ``|grad J|`` to ``|g|`` at the start (an update's aggregation divides by
    token and row counts, so its raw step is much shorter); a fixed positive factor moves no fixed
    point.

    An instance *reaches J** when it ends within ``gap_tol`` (times its largest ``|return|``) of
    ``J*``; it *stops below J** when it ends further away and its gap fell by less than
    ``stall_ratio`` of itself over the last half of the steps (or its expected update vanished);
    otherwise it is *still improving*. Independent parameters only.
    """
    policy = TabularPolicy(problem)
    if start is not None:
        policy.set_action_probs(start)
    J_star = optimal(problem).J
    scale = value_scale(problem).clamp_min(1e-300)
    history = [evaluate(problem, policy.action_probs()).J.detach()]
    still = torch.ones(problem.num_instances, dtype=torch.bool)
    taken = 0
    factor: Tensor | None = None
    for _ in range(steps):
        expected, g_scale = direction(problem, policy, cfg, level)
        norms = torch.stack([e.norm(dim=1) for e in expected]).norm(dim=0)
        if factor is None:
            factor = torch.ones(problem.num_instances, dtype=DTYPE)
            if level == "update":
                true = torch.stack([t.norm(dim=1) for t in policy_gradient(problem, policy)]).norm(dim=0)
                factor = torch.where((norms > 0) & (true > 0), true / norms.clamp_min(1e-300), factor)
        expected = [e * factor[:, None] for e in expected]
        still &= norms > REL_TOL * g_scale.clamp_min(1e-300)
        if not bool(still.any()):
            break
        with torch.no_grad():
            for turn_g, turn_params in zip(expected, _turn_parameters(policy)):
                for p, part in zip(turn_params, turn_g.split([p[0].numel() for p in turn_params], dim=1)):
                    p.add_(part.reshape(p.shape), alpha=lr)
        history.append(evaluate(problem, policy.action_probs()).J.detach())
        taken += 1
    J = torch.stack(history)
    gap = (J_star - J[-1]) / scale
    half = J[len(J) // 2]
    gained = (J[-1] - half) / scale
    verdicts = []
    for i in range(problem.num_instances):
        if float(gap[i]) <= gap_tol:
            verdicts.append("reaches J*")
        elif not bool(still[i]) or float(gained[i]) < stall_ratio * float(gap[i]):
            verdicts.append("stops below J*")
        else:
            verdicts.append("still improving")
    with torch.no_grad():
        probs = [p.detach() for p in policy.action_probs()]
    return Ascent(J, J_star, verdicts, probs, taken, lr, gap_tol)
