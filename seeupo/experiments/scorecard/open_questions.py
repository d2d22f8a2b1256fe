"""The scorecard's capabilities for the questions the field argues about in 2026: stale or mismatched rollouts, the
KL term's gradient, and pass@k as pass@1 rises (``docs/off_policy.md``; the reports ``paper_repro/off_policy`` and
``paper_repro/diversity`` answer them at length).

=========================  ==============================================================  ===========================
capability                 the problems (exact)                                            the rule
=========================  ==============================================================  ===========================
``off_policy_robustness``  1- and 2-turn token bandits, uniform and random starts; rows     mean of the cosine between
                           drawn from a policy one update stale, from an engine at          the step off policy and
                           temperature 1.3, and through per-token noise (other kernels)     on policy (>= 0)
``kl_gradient``            1- and 2-turn token bandits whose every reward is 0, uniform     mean of the cosine between
                           and random policies against a random reference: the update      the step and
                           is the KL term alone, as the algorithm places and aggregates it  -grad KL(pi || ref) (>= 0)
``pass_at_k_retention``    4 prompts sharing one parameter table (4 features), 3 right     mean of pass@64 after
                           answers of 8 each: the algorithm's own exact updates from        the updates, over runs
                           uniform                                                          whose pass@1 rose
=========================  ==============================================================  ===========================

Each compares the algorithm's whole update (loss, aggregation, ``M`` factor, schedule, and its correction and KL term
as configured: a catalogue card's as published) with what the question asks of it, on every instance with its
probability, nothing sampled.
"""

from __future__ import annotations

import math
import time

import torch

from seeupo.experiments.gradient_check import policy_at, random_starts
from seeupo.experiments.scorecard import rules
from seeupo.experiments.scorecard.base import Context, Measured, Sizes, _constant_bandit, _generator
from seeupo.tabular.behaviour import Sampler, behaviour_policy
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import TreeMDP, random_token_bandit

Tensor = torch.Tensor

#: The largest logit change of the step that separates a stale behaviour policy from the policy it updates.
STALE_STEP = 0.5
#: The engines of the off-policy capability: (words, sampler); ``None`` for the stale policy. Each keeps every token
#: drawable, so that a correction can recover the on-policy step (a top-p or top-k engine never draws some tokens:
#: no weight recovers those; the report ``paper_repro/off_policy`` measures it).
ENGINES: tuple[tuple[str, Sampler | None], ...] = (
    (f"rows from the policy one update earlier (an exact ascent step of largest logit change {STALE_STEP:g})", None),
    ("rows from an engine sampling at temperature 1.3", Sampler(temperature=1.3)),
    ("rows through per-token noise of std 0.3 on the log-probabilities (other kernels)", Sampler(noise=0.3, seed=7)),
)


#: A step is zero when its norm is below this share of the size it is compared with (float noise of a sum that is
#: zero in exact arithmetic: k1 in the loss, on policy).
ZERO_SHARE = 1e-9


def _cosine_credit(a: Tensor, b: Tensor, size: float) -> tuple[float, float]:
    """``(credit, cosine)`` of a step ``a`` against a direction ``b``: the cosine floored at 0, 1 within float noise of
    parallel, 0 where either is zero (``a`` below :data:`ZERO_SHARE` of ``size``) or not finite (``cosine`` then
    ``nan``)."""
    from seeupo.tabular.gradient import REL_TOL

    na, nb = float(a.norm()), float(b.norm())
    if not (math.isfinite(na) and math.isfinite(nb)) or na <= ZERO_SHARE * size or nb == 0.0:
        return 0.0, math.nan
    c = float((a * b).sum()) / (na * nb)
    return (1.0 if c >= 1 - REL_TOL else max(0.0, c)), c


def _stale(problem: TreeMDP, probs: list[Tensor]) -> TabularPolicy:
    """The policy one exact ascent step of ``J`` before ``probs`` (the step scaled to a largest logit change of
    :data:`STALE_STEP`), frozen: what an asynchronous trainer one update behind drew its rows from."""
    from seeupo.tabular.exact import evaluate

    mu = policy_at(problem, probs)
    params = list(mu.parameters())
    grads = torch.autograd.grad(evaluate(problem, mu.action_probs()).J.sum(), params)
    largest = max(float(g.abs().max()) for g in grads)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p -= (STALE_STEP / largest if largest > 0 else 0.0) * g
    mu.requires_grad_(False)
    return mu


def _bandits(s: Sizes, capability: str) -> list[tuple[str, TreeMDP]]:
    return [(f"{turns}-turn token bandits", random_token_bandit(s.instances, turns, 2, 2, reward_levels=3,
                                                                generator=_generator(s, capability, turns)))
            for turns in (1, 2)]


def off_policy_robustness(ctx: Context) -> Measured:
    from seeupo.tabular.gradient import update_direction

    s, start = ctx.sizes, time.perf_counter()
    algorithm = ctx.config.replace(group_size=s.group_size)
    credits: list[float] = []
    worst: tuple[float, str] | None = None
    still = 0
    for k, (words, problem) in enumerate(_bandits(s, "off_policy_robustness")):
        for j, probs in enumerate(random_starts(problem, s.starts, _generator(s, "off_policy_robustness", 10 + k))):
            on = torch.cat(update_direction(problem, policy_at(problem, probs), algorithm)[0], dim=1)
            for engine, sampler in ENGINES:
                pi = policy_at(problem, probs)
                mu = _stale(problem, probs) if sampler is None else behaviour_policy(problem, pi, sampler)
                off = torch.cat(update_direction(problem, pi, algorithm, behaviour=mu)[0], dim=1)
                for i in range(problem.num_instances):
                    if float(on[i].norm()) == 0.0 and bool(torch.isfinite(on[i]).all()):
                        still += 1  # no on-policy direction to keep
                        continue
                    credit, cosine = _cosine_credit(off[i], on[i], float(on[i].norm()))
                    credits.append(credit)
                    if credit < 1 - rules.INVARIANCE_TOL and (worst is None or credit < worst[0]):
                        worst = (credit, f"{words}, instance {i}, {'uniform' if j == 0 else f'random start {j}'}, "
                                         f"{engine}: the step's cosine with the on-policy step is "
                                         + ("nan (one of them zero or not finite)" if math.isnan(cosine) else f"{cosine:.4f}"))
    covered = ("1- and 2-turn token bandits (2 tokens of 2; " + f"{s.instances} each), {1 + s.starts} start policies, "
               + "; ".join(w for w, _ in ENGINES) + f"; the algorithm's correction {algorithm.correction!r}, "
               f"G = {s.group_size}" + (f"; {still} cases without an on-policy step left out" if still else ""))
    return Measured(rules.mean_of(credits, what="cases"), covered, worst[1] if worst else None,
                    seconds=time.perf_counter() - start)


def _reference(problem: TreeMDP, generator: torch.Generator) -> TabularPolicy:
    from seeupo.tabular.kl import reference_policy

    return reference_policy(problem, TabularPolicy(problem, init_scale=1.0, generator=generator))


def kl_gradient(ctx: Context) -> Measured:
    from seeupo.tabular.exact import kl_divergence
    from seeupo.tabular.gradient import turn_gradients, update_direction

    s, start = ctx.sizes, time.perf_counter()
    algorithm = ctx.config.replace(group_size=s.group_size)
    if algorithm.kl_coef == 0.0:
        return Measured(rules.no_evidence("no KL term (kl_coef 0): nothing to measure"), "",
                        seconds=time.perf_counter() - start)
    credits: list[float] = []
    worst: tuple[float, str] | None = None
    for turns in (1, 2):
        problem = _constant_bandit(s.instances, turns, 0.0)
        reference = _reference(problem, _generator(s, "kl_gradient", turns))
        for j, probs in enumerate(random_starts(problem, s.starts, _generator(s, "kl_gradient", 10 + turns))):
            policy = policy_at(problem, probs)
            step = torch.cat(update_direction(problem, policy, algorithm, reference=reference)[0], dim=1)
            ref_probs = [p.detach() for p in reference.action_probs()]
            downhill = turn_gradients(kl_divergence(problem, policy.action_probs(), ref_probs).sum(), policy)
            target = -torch.cat(downhill, dim=1)
            for i in range(problem.num_instances):
                credit, cosine = _cosine_credit(step[i], target[i], algorithm.kl_coef * float(target[i].norm()))
                credits.append(credit)
                if credit < 1 - rules.INVARIANCE_TOL and (worst is None or credit < worst[0]):
                    worst = (credit, f"{turns}-turn token bandit, instance {i}, "
                                     f"{'uniform' if j == 0 else f'random policy {j}'} against a random reference: the "
                                     "step's cosine with -grad KL(pi || ref) is "
                                     + ("nan (the step is zero or not finite)" if math.isnan(cosine) else f"{cosine:.4f}"))
    covered = (f"1- and 2-turn token bandits (2 tokens of 2; {s.instances} each) whose every reward is 0, so that the "
               f"update is its KL term alone ({algorithm.kl_estimator} in the {algorithm.kl_placement} at "
               f"{algorithm.kl_coef:g}); {1 + s.starts} policies (uniform and random) against a random reference, "
               f"G = {s.group_size}")
    return Measured(rules.mean_of(credits, what="cases"), covered, worst[1] if worst else None,
                    seconds=time.perf_counter() - start)


#: pass@k is read at this ``k`` (the diversity report's largest).
PASS_K = 64
#: Prompts of the pass@k problem, sharing one parameter table of this many features.
SHARED_PROMPTS, SHARED_FEATURES = 4, 4


def pass_at_k_problem(s: Sizes) -> TreeMDP:
    """The diversity report's shared-prompt bandits: :data:`SHARED_PROMPTS` prompts, 8 answers (3 binary tokens),
    3 right (reward 1) per prompt, seeded by the capability."""
    from seeupo.experiments.diversity import right_answers_bandit

    seed = int(torch.randint(2**31 - 1, (1,), generator=_generator(s, "pass_at_k_retention", 0)))
    return right_answers_bandit(s.instances, seed, prompts=SHARED_PROMPTS)


def pass_at_k_runs(ctx: Context) -> tuple[TreeMDP, Tensor, Tensor]:
    """The algorithm's own exact updates on :func:`pass_at_k_problem` from the uniform policy:
    ``(problem, J [updates + 1, I], pass@k [updates + 1, I])``."""
    from seeupo.tabular.diversity import pass_at_k
    from seeupo.tabular.exact import evaluate
    from seeupo.tabular.train import AlgorithmStep, RunConfig

    s = ctx.sizes
    problem = pass_at_k_problem(s)
    algorithm = ctx.config.replace(group_size=s.group_size)
    updates = s.convergence_updates * ctx.iterations_factor + ctx.rollouts.staleness  # with staleness K, K more
    run_cfg = RunConfig(mode="exact", iterations=updates, optimizer=ctx.optimizer, lr=ctx.lr,  # type: ignore[arg-type]
                        parameterization="shared", feature_dim=SHARED_FEATURES, seed=s.seed,
                        **ctx.rollouts.run_fields())  # type: ignore[arg-type]
    policy = TabularPolicy(problem, "shared", feature_dim=SHARED_FEATURES,
                           generator=torch.Generator().manual_seed(s.seed))
    step = AlgorithmStep(algorithm, run_cfg)
    js, passes = [], []
    for k in range(updates + 1):
        if k:
            step(problem, policy)
        with torch.no_grad():
            probs = policy.action_probs()
            js.append(evaluate(problem, probs).J)
            passes.append(pass_at_k(problem, probs, (PASS_K,))[0])
    return problem, torch.stack(js), torch.stack(passes)


def pass_at_k_retention(ctx: Context) -> Measured:
    s, start = ctx.sizes, time.perf_counter()
    problem, js, passes = pass_at_k_runs(ctx)
    kept: list[float] = []
    still = 0
    worst: tuple[float, str] | None = None
    for i in range(problem.num_instances):
        if not (math.isfinite(float(js[-1, i])) and float(js[-1, i] - js[0, i]) > rules.DECREASE_TOL):
            still += 1  # pass@1 did not rise: what pass@k keeps says nothing about learning
            continue
        value = min(1.0, max(0.0, float(passes[-1, i])))
        kept.append(value)
        if value < 1 - rules.INVARIANCE_TOL and (worst is None or value < worst[0]):
            worst = (value, f"instance {i}: pass@1 {float(js[0, i]):.3f} -> {float(js[-1, i]):.3f}, pass@{PASS_K} "
                            f"{float(passes[0, i]):.4f} -> {value:.4f} after {js.shape[0] - 1} updates")
    updates = js.shape[0] - 1
    covered = (f"{problem.num_instances} bandits of {SHARED_PROMPTS} prompts sharing one parameter table "
               f"({SHARED_FEATURES} features), 8 answers of 3 binary tokens, 3 right per prompt (pass@1 0.375, "
               f"pass@{PASS_K} 1 at the uniform start); pass@{PASS_K} after the algorithm's own exact updates ({updates}: "
               f"its schedule, {ctx.optimizer} at {ctx.lr:g}), G = {s.group_size}"
               + (f"; {still} runs whose pass@1 did not rise left out" if still else ""))
    score = rules.mean_of(kept, what="runs") if kept else rules.no_evidence(
        f"no run raised pass@1 in {updates} updates: no evidence on what it keeps")
    return Measured(score, covered, worst[1] if worst else None, seconds=time.perf_counter() - start)
