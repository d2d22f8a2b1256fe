"""Training loops on tabular problems, in sampled or exact mode, through the algorithm core.

``run`` is the whole loop: build the batch (sampled rollouts or the exact weighted
batch), compute advantages with :func:`seeupo.core.compute_advantages`, update with
:func:`seeupo.core.policy_update` (or the closed-form KL mirror step), and record the
exact ``J`` of every instance after every iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.core.update import UpdateSettings, num_turns, policy_update, sequential_sweep
from seeupo.tabular.behaviour import Sampler, behaviour_policy
from seeupo.tabular.exact import evaluate, kl_divergence, optimal
from seeupo.tabular.kl import kl_reward_problem, reference_policy
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP
from seeupo.tabular.rollout import batch_advantages, exact_advantages, sample_batch

Tensor = torch.Tensor


@dataclass(frozen=True)
class RunConfig:
    """How a tabular run is driven (the algorithm itself is an :class:`AlgorithmConfig`).

    mode: ``"exact"`` (every path weighted by its probability, a group estimator's group-mates by
      their exact distribution) or ``"sampled"`` (``tasks`` x ``group_size`` rollouts per instance).
    exact_closed_form: in exact mode, use a group estimator's closed form over group statistics
      when it has one (GRAE's, fast); ``False`` enumerates the group-mates' outcomes instead
      (:func:`seeupo.tabular.rollout.exact_advantages`), the generic reference.
    update: ``"gradient"`` (optimizer steps on the surrogate, as an LLM run) or ``"mirror"`` (the
      closed-form KL mirror step ``pi_new ∝ pi_old * exp(M / beta)`` per history, independent
      parameters only; ``beta = 0`` is the exact argmax step).
    iterations: outer iterations (new batch each).
    tasks: initial states sampled per instance and iteration (sampled mode).
    optimizer, lr: ``"adam"`` or ``"sgd"`` and its step size.
    reset_optimizer: a fresh optimizer state every iteration (each update starts at ``pi_old``).
    mirror_beta: the KL coefficient of the mirror step.
    parameterization, feature_dim, init_scale: the policy (see :class:`TabularPolicy`).
    staleness: each update's rows come from the policy this many updates earlier (the start policy
      until there is one that old): an asynchronous trainer's stale rollouts; the algorithm's
      ``correction`` reweights them.
    sampler: each update's rows are drawn through this inference engine's sampler (temperature, top-k, top-p,
      noise: :class:`seeupo.tabular.behaviour.Sampler`) from the policy, or from the stale one; ``None``: as
      the policy itself draws them.
    seed: seeds the policy initialisation, rollouts and orders.
    """

    mode: Literal["exact", "sampled"] = "exact"
    exact_closed_form: bool = True
    update: Literal["gradient", "mirror"] = "gradient"
    iterations: int = 20
    tasks: int = 8
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = 0.1
    reset_optimizer: bool = True
    mirror_beta: float = 0.0
    parameterization: Literal["independent", "shared"] = "independent"
    feature_dim: int = 4
    init_scale: float = 0.0
    staleness: int = 0
    sampler: Sampler | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {self.staleness}")


@dataclass
class History:
    """Per-iteration exact measurements, each ``[iterations + 1, I]`` (row 0 is the initial policy)."""

    J: Tensor
    J_star: Tensor
    kl: Tensor  # [iterations, I], KL(pi_k+1 || pi_k) under d_{pi_k+1}
    policy: TabularPolicy

    @property
    def gap(self) -> Tensor:
        return self.J_star[None, :] - self.J

    def violations(self, tol: float = 1e-9) -> Tensor:
        """``[iterations, I]`` size of each decrease of ``J`` larger than ``tol`` (0 where none)."""
        drop = self.J[:-1] - self.J[1:]
        return torch.where(drop > tol, drop, torch.zeros_like(drop))


def make_optimizer(params, run: RunConfig) -> torch.optim.Optimizer:
    if run.optimizer == "adam":
        return torch.optim.Adam(params, lr=run.lr)
    if run.optimizer == "sgd":
        return torch.optim.SGD(params, lr=run.lr)
    raise ValueError(f"unknown optimizer {run.optimizer!r}; expected 'adam' or 'sgd'")


def build_batch(
    problem: TreeMDP, policy: TabularPolicy, cfg: AlgorithmConfig, run: RunConfig, generator: torch.Generator,
    behaviour: TabularPolicy | None = None,
) -> tuple[SampleBatch, Tensor]:
    """The iteration's batch and its per-token advantages, in ``run.mode``; ``behaviour``: the policy the rows are
    drawn from, where it is not ``policy`` (the batch then carries its log-probabilities)."""
    if run.mode == "exact":
        return exact_advantages(problem, policy, cfg, closed_form=run.exact_closed_form, behaviour=behaviour)
    if run.mode != "sampled":
        raise ValueError(f"unknown mode {run.mode!r}; expected 'exact' or 'sampled'")
    batch = sample_batch(problem, policy if behaviour is None else behaviour, run.tasks, cfg.group_size, generator)
    if behaviour is not None:
        with torch.no_grad():
            batch = batch.with_updates(logp_old=policy.token_logps(batch) * batch.token_mask,
                                       logp_behaviour=batch.logp_old)
    return batch, batch_advantages(problem, policy, batch, cfg)


ARGMAX_FLOOR = 1e-12
"""Mass the argmax mirror step leaves spread over all actions, so the sampling distribution stays
positive (an assumption of the paper's Theorem 2) and paths through several discarded actions
do not underflow to probability 0 (which would hide their histories from later sweeps)."""


class MirrorStep:
    """The closed-form KL mirror step of one turn: a :class:`seeupo.core.update.TurnUpdate`.

    For the updated turn the estimated action value is ``Qhat(h, a) = sum w M / sum w`` over
    the rows at ``(h, a)`` (``w`` the row weights, ``M`` the weights passed: the advantage or
    the HAML weight), and ``pi_new(.|h) ∝ pi_old(.|h) exp(Qhat(h, .) / beta)``; ``beta = 0``
    puts all mass but ``ARGMAX_FLOOR`` on the best sampled action. Histories without rows keep
    their policy. ``pi_old`` is the policy when the step was made.
    """

    def __init__(self, policy: TabularPolicy, batch: SampleBatch, beta: float) -> None:
        self.policy, self.batch, self.beta = policy, batch, beta
        with torch.no_grad():
            self.old = policy.action_probs()
        self.new = [p.clone() for p in self.old]

    @torch.no_grad()
    def __call__(self, rows: Tensor, weights: Tensor) -> None:
        sub, old = self.batch.select(rows), self.old
        t = int(sub.turn[0])
        num_inst, num_hist, num_act = self.new[t].shape
        key = (sub.instance * num_hist + sub.data["hist"]) * num_act + sub.data["action"]
        w = sub.weight * sub.valid.to(DTYPE)
        row_m = (weights * sub.token_mask).sum(1) / sub.token_mask.sum(1)
        num = torch.zeros(num_inst * num_hist * num_act, dtype=DTYPE).index_add_(0, key, w * row_m)
        den = torch.zeros_like(num).index_add_(0, key, w)
        seen = (den > 0).reshape(num_inst, num_hist, num_act)
        qhat = (num / den.clamp_min(1e-300)).reshape(seen.shape)
        has_data = seen.any(-1, keepdim=True)
        if self.beta > 0:
            logits = old[t].clamp_min(1e-300).log() + torch.where(seen, qhat, 0.0) / self.beta
            target = torch.softmax(logits, -1)
        else:
            best = torch.where(seen, qhat, torch.full_like(qhat, -torch.inf)).argmax(-1)
            greedy = torch.nn.functional.one_hot(best, num_act).to(DTYPE)
            target = (1.0 - ARGMAX_FLOOR) * greedy + ARGMAX_FLOOR / num_act
        self.new[t] = torch.where(has_data, target, old[t])
        self.policy.set_action_probs(self.new)


def mirror_step(
    policy: TabularPolicy, batch: SampleBatch, advantages: Tensor, cfg: AlgorithmConfig, beta: float,
    generator: torch.Generator | None = None,
) -> None:
    """Closed-form KL mirror step per history (:class:`MirrorStep`), through the same sweep as the gradient update.

    A simultaneous schedule updates every turn with ``M = A``; a sequential one runs
    :func:`seeupo.core.update.sequential_sweep` with the mirror step as its turn update.
    """
    update_turn = MirrorStep(policy, batch, beta)
    if cfg.schedule == "simultaneous":
        for t in range(num_turns(batch)):
            rows = batch.turn == t
            update_turn(rows, advantages[rows])
    else:
        sequential_sweep(policy, batch, advantages, cfg, update_turn, generator)


Step = Callable[[TreeMDP, TabularPolicy], None]
"""One iteration of an algorithm: improve ``policy`` on ``problem`` in place."""


class AlgorithmStep:
    """One iteration of ``cfg`` driven by ``run_cfg``: batch, advantages, then the update.

    Keeps the generator (and, unless ``run_cfg.reset_optimizer``, the optimizer state)
    across calls, as a training loop does. With a KL term (``cfg.kl_coef > 0``) the reference is
    the policy of the first call, frozen (a language-model run's starting model): in the loss, its
    log-probabilities of the batch's tokens; in the reward, :func:`seeupo.tabular.kl.kl_reward_problem`
    (the advantages see the penalised rewards, ``J`` is measured on the problem itself).
    """

    def __init__(self, cfg: AlgorithmConfig, run_cfg: RunConfig = RunConfig()) -> None:
        if cfg.kl_coef > 0.0 and run_cfg.update == "mirror":
            raise ValueError("the closed-form mirror step has its own KL (mirror_beta): kl_coef must be 0")
        self.cfg, self.run_cfg = cfg, run_cfg
        self.generator = torch.Generator().manual_seed(run_cfg.seed)
        self.optimizer: torch.optim.Optimizer | None = None
        self.reference: TabularPolicy | None = None  # with a KL term: the policy of the first call, frozen
        self.past: list[TabularPolicy] = []  # with staleness k: the policies of the last k calls, frozen

    def __call__(self, problem: TreeMDP, policy: TabularPolicy) -> None:
        kl = self.cfg.kl_coef > 0.0
        if kl and self.reference is None:
            self.reference = reference_policy(problem, policy)
        behaviour = None
        if self.run_cfg.staleness > 0:
            self.past = (self.past + [reference_policy(problem, policy)])[-(self.run_cfg.staleness + 1):]
            behaviour = self.past[0] if len(self.past) > 1 else None
        if self.run_cfg.sampler is not None and not self.run_cfg.sampler.on_policy:
            behaviour = behaviour_policy(problem, policy if behaviour is None else behaviour, self.run_cfg.sampler)
        if kl and self.cfg.kl_placement == "reward":
            learned = kl_reward_problem(problem, policy, self.reference, self.cfg)  # type: ignore[arg-type]
        else:
            learned = problem
        batch, adv = build_batch(learned, policy, self.cfg, self.run_cfg, self.generator, behaviour)
        if self.run_cfg.update == "mirror":
            if policy.parameterization != "independent":
                raise ValueError("the closed-form mirror step needs independent parameters")
            mirror_step(policy, batch, adv, self.cfg, self.run_cfg.mirror_beta, self.generator)
            return
        if self.optimizer is None or self.run_cfg.reset_optimizer:
            self.optimizer = make_optimizer(policy.parameters(), self.run_cfg)
        logp_ref = None
        if kl and self.cfg.kl_placement != "reward":
            with torch.no_grad():
                logp_ref = self.reference.token_logps(batch)  # type: ignore[union-attr]
        policy_update(policy, self.optimizer, batch, adv, self.cfg,
                      UpdateSettings(generator=self.generator, logp_ref=logp_ref))


def track(
    problem: TreeMDP,
    step: Step,
    policy: TabularPolicy,
    iterations: int,
    progress: Callable[[int], None] | None = None,
) -> History:
    """Apply ``step`` ``iterations`` times and record the exact ``J`` and KL after each."""
    j_star = optimal(problem).J
    with torch.no_grad():
        probs = policy.action_probs()
    js, kls = [evaluate(problem, probs).J], []
    for k in range(iterations):
        step(problem, policy)
        with torch.no_grad():
            new_probs = policy.action_probs()
        js.append(evaluate(problem, new_probs).J)
        kls.append(kl_divergence(problem, new_probs, probs))
        probs = new_probs
        if progress is not None:
            progress(k + 1)
    kl = torch.stack(kls) if kls else torch.zeros(0, problem.num_instances, dtype=DTYPE)
    return History(torch.stack(js), j_star, kl, policy)


def initial_policy(problem: TreeMDP, run_cfg: RunConfig) -> TabularPolicy:
    """The policy ``run_cfg`` starts from (seeded)."""
    return TabularPolicy(
        problem, run_cfg.parameterization, feature_dim=run_cfg.feature_dim, init_scale=run_cfg.init_scale,
        generator=torch.Generator().manual_seed(run_cfg.seed),
    )


def run(
    problem: TreeMDP,
    cfg: AlgorithmConfig,
    run_cfg: RunConfig = RunConfig(),
    *,
    policy: TabularPolicy | None = None,
    progress: Callable[[int], None] | None = None,
) -> History:
    """Train a policy on every instance of ``problem`` and record the exact ``J`` after each iteration."""
    policy = policy if policy is not None else initial_policy(problem, run_cfg)
    return track(problem, AlgorithmStep(cfg, run_cfg), policy, run_cfg.iterations, progress)
