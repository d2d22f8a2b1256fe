"""``seeupo train``: one loop for every preset, on a causal language model and a multi-turn environment.

Each step, top to bottom (:meth:`Trainer.step`):

1. draw ``tasks_per_step`` tasks (shuffled epochs over the environment's tasks) and roll out
   ``group_size`` episodes of each with the rollout engine (:func:`seeupo.llm.agent.run_episodes`);
2. score the sampled tokens with the policy (``logp_old``; the engine's own log-probabilities
   are compared with it: ``rollout/logp_diff_max``), the reference model (KL) and the critic (GAE).
   An update of one optimizer step (one epoch, one minibatch: the paper's setting,
   :func:`seeupo.core.update.is_on_policy`) scores ``logp_old`` in its own passes instead, as
   verl's on-policy actor does: the same numbers, one forward pass fewer;
3. advantages and the update with :func:`seeupo.core.compute_advantages` and
   :func:`seeupo.core.policy_update`, the very functions the tabular engine checks exactly;
4. the critic's clipped value loss (``ppo``), the learning-rate schedule, the weight sync to the
   engine, metrics (verl's names) and, every ``checkpoint.every`` steps, a checkpoint.

Before the first step the environment's supervised warm-up, when it has one (:func:`warm_up`; the
bridge's format warm-up), trains the whole model; then :func:`seeupo.llm.build.build_models` makes
the policy, reference, critic and rollout engine (shards under FSDP), and the metrics of
:mod:`seeupo.llm.metrics` name what each step did.

Every random draw of step ``k`` (tasks, sampling, observations, minibatch order) is seeded by
``(seed, k)``, so a run resumed from the checkpoint of step ``k`` makes exactly the steps an
uninterrupted run makes. A step whose loss or gradient is not finite is skipped by the core;
after ``optim.max_non_finite`` such steps in a row the run writes a checkpoint and stops.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.losses import with_kl_in_reward
from seeupo.core.parallel import DataParallel, owned, score_rows
from seeupo.core.update import UpdateSettings, compute_advantages, is_on_policy, policy_update
from seeupo.llm.agent import AgentLimits, AgentRollout, ChatDelta, NoPromptFits, run_episodes
from seeupo.llm.build import build_models, load_model
from seeupo.llm.checkpoint import (
    latest_checkpoint, load_checkpoint, load_rng, load_sharded, save_checkpoint, saved_run_config, set_rng_state,
)
from seeupo.llm.config import OptimConfig, TrainConfig, resume_changes
from seeupo.llm.distributed import Distributed, full_state_dict, gather_batch
from seeupo.llm.envs import EnvSpec, WarmUp, make_environment
from seeupo.llm.layout import scoring_batch
from seeupo.llm.metrics import (
    MetricsLogger, NullLogger, critic_metrics, m_metrics, progress_bar, timing_metrics, update_metrics,
)
from seeupo.llm.policy import CausalLMPolicy, clipped_value_loss
from seeupo.llm.rollout import RolloutEngine, SamplingParams
from seeupo.validation.errors import InputError


class TrainingDiverged(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


def warm_up(policy: CausalLMPolicy, spec: WarmUp, tokenizer: Any, *, progress: bool = False) -> dict[str, float]:
    """Run an environment's supervised warm-up ``spec`` on ``policy``'s model, before training.

    The first step of a run that has one (e.g. the bridge's format warm-up, on the whole model,
    before any copy or shard of it): up to ``spec.steps`` Adam steps at ``spec.lr``, each on one
    batch of ``spec.examples`` drawn with a generator seeded by ``spec.seed``, minimising the
    batch's mean negative log-likelihood of the responses (summed over each response's tokens)
    given their contexts. Without ``spec.target`` it takes exactly ``spec.steps`` steps; with
    ``spec.target = (name, measure, threshold)`` it measures ``measure(policy)`` before the first
    step and every ``spec.check_every`` steps and stops once the value is at least
    ``threshold`` (the steps taken are those of the fixed-length warm-up, cut short).
    Deterministic given the model, the spec and the policy's temperature.

    Returns ``{spec.metric: mean log-likelihood}`` of the last batch, measured before its step
    (NaN when no step was needed); with a target also ``{name: value reached,
    warm_up_steps_metric(spec): steps taken}``. ``progress``: a progress bar of the steps (a warm-up
    may take minutes before the first training step).
    """
    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=spec.lr)
    loglik = math.nan
    taken, reached = 0, None
    bar = progress_bar(None, progress, total=spec.steps, desc="warm-up", leave=False)
    while True:
        if spec.target is not None and (taken % spec.check_every == 0 or taken == spec.steps):
            name, measure, threshold = spec.target
            reached = float(measure(policy))
            if hasattr(bar, "set_postfix"):
                bar.set_postfix({name.split("/")[-1]: f"{reached:.3f} (target {threshold:g})"})
            if reached >= threshold:
                break
        if taken == spec.steps:
            break
        contexts, responses = spec.examples(generator)
        batch = scoring_batch(contexts, responses, tokenizer.pad_token_id or 0)
        loss = -policy.token_logps(batch).sum(1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loglik = -float(loss.detach())
        taken += 1
        if hasattr(bar, "update"):
            bar.update(1)
    if hasattr(bar, "close"):
        bar.close()
    logs = {spec.metric: loglik}
    if spec.target is not None:
        logs |= {spec.target[0]: reached, warm_up_steps_metric(spec): float(taken)}
    return logs


def warm_up_steps_metric(spec: WarmUp) -> str:
    """The name under which :func:`warm_up` logs the steps it took (``spec.target`` set)."""
    return spec.metric.removesuffix("_loglik") + "_steps"


def _no_prompt_fits(limit: int, shortest: int | None) -> InputError:
    seen = f" (the shortest prompt seen has {shortest} tokens)" if shortest is not None else ""
    return InputError("config.rollout.max_context", f"{limit} tokens: no prompt of this step fits the context{seen}; "
                                                    "raise rollout.max_context")


def _fusion_switched_off(optim: OptimConfig) -> str | None:
    """Why the config switches off the fused ratio passes of a sequential update, or ``None``."""
    if not optim.fuse_ratio_passes:
        return "optim.fuse_ratio_passes is false"
    if optim.scoring == "per_row":
        # per row, a fused step would forward the finished turn's rows with gradient, apart from
        # the trained ones: more work, not less (benchmarks/RESULTS.md, issue 18)
        return "optim.scoring is per_row (fusing saves a pass only where a later turn's row carries the earlier one)"
    return None


def adamw(params: Iterable[torch.Tensor], **kwargs: Any) -> torch.optim.AdamW:
    """AdamW over ``params``; on CUDA its fused kernel (one kernel per step instead of several
    per-tensor-list passes; the same update to rounding, as Hugging Face's ``adamw_torch_fused``)."""
    params = list(params)
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(params, fused=fused or None, **kwargs)


def _step_seed(seed: int, step: int, stream: int) -> int:
    return (seed * 1_000_003 + step * 7_919 + stream) % (2**63 - 1)


class Trainer:
    """One training run of ``cfg`` (see the module docstring).

    ``model``/``tokenizer`` replace ``cfg.model``; ``engine`` replaces the default Hugging Face
    ``generate`` engine (it must sample from the weights handed to its ``sync_weights`` after
    each update). ``dist`` (:func:`seeupo.llm.distributed.init_distributed`) makes this process
    one of several data-parallel ones (:mod:`seeupo.llm.distributed`): it rolls out its share of
    the tasks and holds a shard of each model, and every process makes the update that one
    process would make on the whole batch. ``check_prompts`` refuses a ``rollout.max_context``
    that none of the first tasks' prompts fits before the set-up steps (training; an evaluation
    scores such episodes as failed instead). ``progress``: say on stderr what the set-up does (loading,
    the warm-up with its own progress bar), which may take minutes before the first step (process 0).

    Construction, top to bottom: load the model, build the environment, the set-up steps (with
    ``prepare``: the environment's supervised :func:`warm_up` and its ``prepare``; their metrics
    are logged at step 0), the models of the run (:func:`seeupo.llm.build.build_models`), the
    optimizers. ``seeupo eval`` of a checkpoint passes ``prepare=False``: its weights replace the
    warmed-up ones.
    """

    def __init__(self, cfg: TrainConfig, *, model: torch.nn.Module | None = None, tokenizer: Any = None,
                 engine: RolloutEngine | None = None, prepare: bool = True, dist: Distributed | None = None,
                 check_prompts: bool = False, progress: bool = False) -> None:
        self.cfg = cfg
        self.dist = dist
        progress = progress and (dist is None or dist.is_main)
        say = (lambda message: print(f"set-up: {message}", file=sys.stderr, flush=True)) if progress else (lambda _: None)
        self.dp: DataParallel | None = dist.dp if dist is not None else None
        if dist is not None and cfg.rollout.tasks_per_step % dist.dp.world_size:
            world = dist.dp.world_size
            raise InputError("config.rollout.tasks_per_step",
                             f"{cfg.rollout.tasks_per_step} tasks cannot be shared by {world} processes (use a multiple of {world})")
        if model is None:
            say(f"loading the model {cfg.model.name} ...")
            model, tokenizer = load_model(cfg.model.name, cfg.model.dtype, cfg.model.seed)
        self.model, self.tokenizer = model, tokenizer
        self.model.eval()  # no dropout: the policy that samples is the policy that is scored
        self.env: EnvSpec = make_environment(cfg.env.name, cfg.env.options, tokenizer, cfg.seed)
        say(f"environment {cfg.env.name}: {len(self.env.tasks)} training tasks")
        self.out_dir = Path(cfg.out_dir)

        # set-up steps, on the whole model before any copy or sharding; logged at step 0
        self.setup_metrics: dict[str, float] = {}
        if check_prompts:
            self._check_prompts_fit()
        if prepare and self.env.warm_up is not None:
            spec = self.env.warm_up
            say(f"supervised warm-up of the fresh model: at most {spec.steps} steps"
                + (f", until {spec.target[0]} >= {spec.target[2]:g}" if spec.target is not None else ""))
            self.setup_metrics |= warm_up(CausalLMPolicy(model, temperature=cfg.rollout.temperature), spec, tokenizer,
                                          progress=progress)
            if spec.target is not None and self.setup_metrics[spec.target[0]] < spec.target[2]:
                # the run goes on (it is the user's to stop), but its RL steps may see no signal at all
                warnings.warn(f"the warm-up stopped at its cap of {spec.steps} steps with {spec.target[0]} = "
                              f"{self.setup_metrics[spec.target[0]]:.4f}, below its target {spec.target[2]:g}; "
                              "the training steps may get no learning signal", stacklevel=2)
        if prepare and self.env.prepare is not None:
            self.setup_metrics |= self.env.prepare(CausalLMPolicy(model, temperature=cfg.rollout.temperature))

        say("building the run's models and optimizers ...")
        built = build_models(cfg, model, tokenizer, engine=engine, dist=dist)
        self.policy, self.reference, self.critic = built.policy, built.reference, built.critic
        self.engine, self.rollout_model = built.engine, built.rollout_model

        o = cfg.optim
        self.optimizer = adamw(self.policy.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
        warmup = max(1, o.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda k: min(1.0, (k + 1) / warmup))
        self.critic_optimizer = None
        if self.critic is not None:
            self.critic_optimizer = adamw(self.critic.parameters(), lr=o.critic_lr)
        self.step_count = 0
        self.non_finite_in_a_row = 0
        self._unfused_reasons: set[str] = set()  # why ratio passes were not fused, each warned of once

    @property
    def is_main(self) -> bool:
        """Whether this process writes logs, metrics and progress (process 0, or the only one)."""
        return self.dist is None or self.dist.is_main

    # ------------------------------------------------------------------ the loop

    def train(self, *, resume: bool = False, progress: bool | None = None) -> list[dict[str, float]]:
        """Run to ``cfg.steps``; returns the metrics of the steps run here."""
        return list(self.run(resume=resume, progress=progress))

    def run(self, *, resume: bool = False, progress: bool | None = None) -> Iterator[dict[str, float]]:
        """:meth:`train`, yielding each step's metrics as soon as they are logged (process 0 logs).

        With ``resume``, the run continues from the newest checkpoint of ``out_dir`` (a fresh run
        when there is none); ``cfg`` may differ from the run's saved config only in
        :data:`~seeupo.llm.config.RESUMABLE_FIELDS` (else :class:`InputError`), ``config.yaml`` is
        left as the run began, and each resume appends ``{time, resumed_from_step, changes}`` to
        ``RESUME_LOG``.
        """
        cfg = self.cfg
        saved = saved_run_config(self.out_dir) if resume else None
        changes = resume_changes(saved, cfg) if saved is not None else {}  # refuses before anything is loaded
        start = self.resume() if resume else 0
        progress = (cfg.logging.progress if progress is None else progress) and self.is_main
        with self._logger(start, changes) as logger:
            if start == 0:
                initial = dict(self.setup_metrics)
                if self.env.metrics is not None:
                    initial |= self.env.metrics(self.policy)
                if initial:
                    logger.log(0, initial)
            bar = progress_bar(range(start, cfg.steps), progress, initial=start, total=cfg.steps)
            for _ in bar:
                metrics = self.step()
                logger.log(self.step_count, metrics)
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3g}" for k in ("critic/score/mean", "bridge/J") if k in metrics})
                done = self.step_count == cfg.steps
                if done or self.step_count % cfg.checkpoint.every == 0 or self.non_finite_in_a_row >= cfg.optim.max_non_finite:
                    self.save()
                yield metrics
                if self.non_finite_in_a_row >= cfg.optim.max_non_finite:
                    raise TrainingDiverged(
                        f"{self.non_finite_in_a_row} optimizer steps in a row had a non-finite loss or gradient "
                        f"(step {self.step_count}); checkpoint saved in {self.out_dir / 'checkpoints'}; "
                        "lower optim.lr or check the rewards")

    def _logger(self, start: int, changes: dict[str, tuple[Any, Any]]) -> MetricsLogger | NullLogger:
        """The metrics logger of a run starting at step ``start`` (process 0; the others log nothing).

        A fresh run (``start == 0``) writes ``config.yaml``; a resumed one leaves it as the run
        began and appends ``changes`` (from :func:`~seeupo.llm.config.resume_changes`) to ``RESUME_LOG``.
        """
        if not self.is_main:
            return NullLogger()
        cfg = self.cfg
        self.out_dir.mkdir(parents=True, exist_ok=True)
        resumed = start > 0
        if resumed:
            _append_resume_log(self.out_dir, start, changes)
        else:
            (self.out_dir / "config.yaml").write_text(_yaml_dump(cfg.to_dict()))
        return MetricsLogger(self.out_dir, tensorboard=cfg.logging.tensorboard, wandb_project=cfg.logging.wandb_project,
                             resume_step=start if resumed else None, config=cfg.to_dict())

    # ------------------------------------------------------------------ one step

    def step(self) -> dict[str, float]:
        """One training step; returns its metrics."""
        t_start = time.perf_counter()
        rollout = self.rollout(self.step_count + 1)
        batch = gather_batch(rollout.batch, self.dp) if self.dp is not None else rollout.batch
        if self.cfg.rollout.vllm_sleep:  # the update gets the engine's GPU memory
            self.engine.sleep()
        t_gen = time.perf_counter()
        metrics = self.update(batch, rollout.gamma)
        metrics |= timing_metrics(metrics["perf/total_num_tokens"], gen_s=t_gen - t_start, step_s=time.perf_counter() - t_start)
        return metrics

    def rollout(self, step: int) -> AgentRollout:
        """This process's episodes of step ``step`` (its share of the tasks, ``group_size`` each)."""
        cfg = self.cfg
        stream = 8 * (self.dp.rank if self.dp is not None else 0)  # each process draws its own samples
        env_generator = torch.Generator().manual_seed(_step_seed(cfg.seed, step, 2 + stream))
        params = SamplingParams(
            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
            max_new_tokens=self.env.max_new_tokens or cfg.rollout.max_new_tokens,
            stop_token_ids=(self.tokenizer.eos_token_id,), seed=_step_seed(cfg.seed, step, 3 + stream),
        )
        try:
            return run_episodes(
                self.engine, self.tokenizer, lambda: self.env.make(env_generator), self.local_tasks(step),
                cfg.algorithm.group_size, params, AgentLimits(max_turns=cfg.rollout.max_turns, max_context=cfg.rollout.max_context),
                dtype=torch.promote_types(next(self.model.parameters()).dtype, torch.float32),
            )
        except NoPromptFits:  # a setting the user chose, not a fault of the toolkit: one line, exit 2
            raise _no_prompt_fits(cfg.rollout.max_context, None) from None

    def update(self, batch: SampleBatch, gamma: float = 1.0) -> dict[str, float]:
        """Score, advantages and the update on a rollout ``batch`` (with data parallelism: the
        global batch of :func:`~seeupo.llm.distributed.gather_batch`) whose returns are discounted by
        ``gamma``; returns the step's metrics."""
        cfg, algo, dp = self.cfg, self.cfg.algorithm, self.dp
        step = self.step_count + 1
        t_start = time.perf_counter()
        real = batch.token_mask & batch.valid[:, None]
        rollout_logp = batch.logp_old
        # one optimizer step: its own passes score the old log-probabilities, no pass of their own; a rollout
        # correction needs them scored apart from the engine's (the behaviour policy's) log-probabilities
        corrected = algo.correction != "none"
        on_policy = is_on_policy(algo) and not corrected
        with torch.no_grad():
            if not on_policy:
                batch = batch.with_updates(logp_old=score_rows(self.policy.token_logps, batch, dp),
                                           logp_behaviour=rollout_logp if corrected else None)
            logp_ref = score_rows(self.reference.logp_ref, batch, dp) if self.reference is not None else None
            values = score_rows(self.critic.values, batch, dp) if self.critic is not None else None
        if algo.kl_coef > 0.0 and algo.kl_placement == "reward":  # the penalty enters before the advantages
            batch = with_kl_in_reward(batch, logp_ref, algo, gamma)
        advantages = compute_advantages(batch, algo, critic_values=values)
        t_prep = time.perf_counter()

        stats = policy_update(self.policy, self.optimizer, batch, advantages, algo, UpdateSettings(
            logp_ref=logp_ref, generator=torch.Generator().manual_seed(_step_seed(cfg.seed, step, 4)),
            micro_batch_rows=cfg.optim.micro_batch_rows, micro_batch_tokens=cfg.optim.micro_batch_tokens,
            row_tokens=batch.data["attention_mask"].sum(1), max_grad_norm=cfg.optim.max_grad_norm, dp=dp,
            fuse_ratio_passes=_fusion_switched_off(cfg.optim) is None, old_logps_from_update=on_policy,
        ))
        if on_policy:
            batch = batch.with_updates(logp_old=stats.logp_old)
        logp_diff = (batch.logp_old - rollout_logp).abs()[real]
        if stats.fusion_blocker is not None:
            self._warn_unfused(_fusion_switched_off(cfg.optim) or stats.fusion_blocker)
        m_logs = {}
        if cfg.logging.m_final or cfg.logging.m_drift:
            m_logs = m_metrics(self.policy, batch, algo, stats, drift=cfg.logging.m_drift, dp=dp)
        critic_loss = self._update_critic(batch, advantages, values) if self.critic is not None else None
        lr = self.scheduler.get_last_lr()[0]
        if stats.skipped_steps < stats.steps:  # the schedule counts the steps actually taken
            self.scheduler.step()
        if self.cfg.rollout.vllm_sleep:
            self.engine.wake_up()
        self.engine.sync_weights(self._rollout_weights())
        t_update = time.perf_counter()

        self.non_finite_in_a_row = self.non_finite_in_a_row + 1 if stats.skipped_steps == stats.steps else 0
        self.step_count = step
        metrics = update_metrics(batch, stats, logp_diff, lr=lr, prep_s=t_prep - t_start, update_s=t_update - t_prep)
        metrics |= m_logs
        if critic_loss is not None:
            metrics |= critic_metrics(critic_loss, values, batch)
        if self.env.metrics is not None:
            metrics |= self.env.metrics(self.policy)
        return metrics

    def _warn_unfused(self, reason: str) -> None:
        """Warn once per run and reason (process 0) that a sequential update's ratio passes were not
        fused: each turn then costs a separate no-gradient pass (``actor/fused_ratio_passes`` is 0)."""
        if self.is_main and reason not in self._unfused_reasons:
            self._unfused_reasons.add(reason)
            warnings.warn(f"ratio passes not fused: {reason}", stacklevel=3)

    def _update_critic(self, batch: SampleBatch, advantages: torch.Tensor, values: torch.Tensor) -> float:
        """One pass of the clipped value loss towards the GAE returns ``A + V_old`` (PPO).

        With data parallelism each process's loss is its rows' share of the global token mean.
        """
        real = batch.token_mask & batch.valid[:, None]
        returns = (advantages + values).detach()
        mine = owned(batch, self.dp)
        loss = clipped_value_loss(self.critic.values(batch.select(mine)), values[mine].detach(), returns[mine], real[mine],
                                  num_tokens=float(real.sum()))
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.optim.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.cfg.optim.max_grad_norm)
        self.critic_optimizer.step()
        total = loss.detach().to(torch.float64).cpu().reshape(1)
        return float(self.dp.sum(total)) if self.dp is not None else float(total)

    def _rollout_weights(self) -> torch.nn.Module:
        """The module the engine samples from, holding the current weights (the replica, refreshed, under FSDP)."""
        if self.rollout_model is self.model:
            return self.model
        self.rollout_model.load_state_dict(full_state_dict(self.model))
        return self.rollout_model

    # ------------------------------------------------------------------ data

    def tasks_for(self, step: int) -> list[Any]:
        """The tasks of step ``step`` (1-based): consecutive slices of per-epoch permutations."""
        tasks, per_step = self.env.tasks, self.cfg.rollout.tasks_per_step
        start = (step - 1) * per_step
        out = []
        for k in range(start, start + per_step):
            epoch, i = divmod(k, len(tasks))
            perm = torch.randperm(len(tasks), generator=torch.Generator().manual_seed(_step_seed(self.cfg.seed, epoch, 1)))
            out.append(tasks[int(perm[i])])
        return out

    def local_tasks(self, step: int) -> list[Any]:
        """This process's share of :meth:`tasks_for`: the ``rank``-th of ``world_size`` consecutive slices."""
        tasks = self.tasks_for(step)
        if self.dp is None:
            return tasks
        per = len(tasks) // self.dp.world_size
        return tasks[self.dp.rank * per : (self.dp.rank + 1) * per]

    def _check_prompts_fit(self, sample: int = 8) -> None:
        """Refuse a ``rollout.max_context`` that no prompt fits, before any set-up step or rollout.

        Looks at the first ``sample`` distinct tasks (rendering a prompt is cheap; playing one is
        not): when none of them fits, the run could sample nothing.
        """
        limit, seen, lengths = self.cfg.rollout.max_context, [], []
        chat = ChatDelta(self.tokenizer)
        for task in self.env.tasks:
            if len(seen) >= sample:
                break
            if any(task == other for other in seen):
                continue
            seen.append(task)
            env = self.env.make(torch.Generator().manual_seed(0))
            lengths.append(len(chat.prompt_ids(env.reset(task))))
            close = getattr(env, "close", None)
            if callable(close):
                close()
        if lengths and min(lengths) >= limit:
            raise _no_prompt_fits(limit, min(lengths))

    # ------------------------------------------------------------------ checkpoints

    def save(self) -> Path:
        state = {"scheduler": self.scheduler.state_dict(),
                 "trainer": {"step": self.step_count, "non_finite_in_a_row": self.non_finite_in_a_row}}
        meta = {"config": self.cfg.to_dict(), "processes": self.dp.world_size if self.dp is not None else 1}
        return save_checkpoint(self.out_dir / "checkpoints", self.step_count, state, meta=meta,
                               keep=self.cfg.checkpoint.keep, sharded=self.sharded_state())

    def resume(self) -> int:
        """Load the newest checkpoint of ``out_dir`` (written by any number of processes); returns its step (0 when none)."""
        path = latest_checkpoint(self.out_dir / "checkpoints")
        if path is None:
            return 0
        self.load_sharded_state(load_sharded(path, self.sharded_state()))
        state = load_checkpoint(path)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step_count = state["trainer"]["step"]
        self.non_finite_in_a_row = state["trainer"]["non_finite_in_a_row"]
        rng = load_rng(path)
        if rng is not None:
            set_rng_state(rng)
        self.engine.sync_weights(self._rollout_weights())
        return self.step_count

    def sharded_state(self) -> dict[str, Any]:
        """The models' and optimizers' state dicts (keyed by parameter names; shards under FSDP)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if not self.optimizer.state:  # torch initialises a fresh optimizer's state only where no gradient is left
            self.model.zero_grad(set_to_none=True)
            if self.critic is not None:
                self.critic.zero_grad(set_to_none=True)
        model, optimizer = get_state_dict(self.model, self.optimizer)
        state = {"model": model, "optimizer": optimizer}
        if self.critic is not None:
            critic, critic_optimizer = get_state_dict(self.critic, self.critic_optimizer)
            state |= {"critic": critic, "critic_optimizer": critic_optimizer}
        if self.reference is not None:
            state["reference"] = get_model_state_dict(self.reference.model)
        return state

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        if self.critic is not None:
            set_state_dict(self.critic, self.critic_optimizer, model_state_dict=state["critic"],
                           optim_state_dict=state["critic_optimizer"])
        if self.reference is not None:
            set_model_state_dict(self.reference.model, state["reference"])


RESUME_LOG = "resume_log.jsonl"


def _append_resume_log(out_dir: Path, step: int, changes: dict[str, tuple[Any, Any]]) -> None:
    import datetime
    import json

    record = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "resumed_from_step": step,
              "changes": {k: [old, new] for k, (old, new) in changes.items()}}
    with (out_dir / RESUME_LOG).open("a") as f:
        f.write(json.dumps(record) + "\n")


def _yaml_dump(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)
