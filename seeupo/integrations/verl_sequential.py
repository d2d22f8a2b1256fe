"""SeeUPO's sequential update on verl's multi-turn data: the toolkit's own sweep, keyed by trajectory.

verl's agent loop (0.9.1) gives one row per trajectory::

    prompts        [B, P]  left-padded prompt ids
    responses      [B, R]  |<- turn 1 ->|<- tool / user tokens ->|<- turn 2 ->| ... |<- padding ->|
    response_mask  [B, R]  | 1 ... 1    | 0 ...               0 | 1 ... 1    | ... | 0 ...    0  |
    attention_mask [B, P + R], old_log_probs / ref_log_prob / token_level_rewards [B, R], uid (per prompt)

verl has no per-token turn id: a turn is a contiguous run of ones in ``response_mask``
(:func:`turn_spans`; two assistant messages with no token between them would read as one turn).
:func:`sample_batch_from_verl` turns such a batch into the toolkit's language-model layout, one
row per (trajectory, turn): the context is the prompt and the response up to the turn, the row's
response the turn's tokens (:mod:`seeupo.llm.layout`). Trajectory ``i`` is verl row ``i`` *of the
batch as given*: every row of a trajectory shares its ``traj_id``, so the factor ``F[traj]`` of
``M`` is read by trajectory, never by position, and re-ordering verl's rows (``balance_batch``)
re-orders whole trajectories with their factors.

:func:`sequential_update` is then the core's own update on that batch:
:func:`seeupo.core.update.policy_update` with :class:`seeupo.llm.policy.CausalLMPolicy` around
the actor's module (advantages from the registered estimator ``cfg.advantage``; turns in
``cfg.turn_order``; ``M`` factors from ``cfg.m_factor``; each turn's ratio read in the next turn's
first optimizer step where :func:`seeupo.core.update.fusion_blocker` allows). With the packed
layout a pass forwards each trajectory's row once, as verl does, and reads every turn from it: a
fused SeeUPO update forwards each trajectory once per turn, T passes with gradient, where the
paper's code makes, per turn, a separate batch, an old-log-prob pass, the update and a ratio pass.

This module needs torch and transformers only; verl's ``DataProto`` (or anything with ``batch``
and ``non_tensor_batch`` mappings) is read by key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.config import AlgorithmConfig
from seeupo.core.parallel import DataParallel
from seeupo.core.registry import adv_estimator
from seeupo.core.update import UpdateSettings, UpdateStats, compute_advantages, policy_update
from seeupo.llm.layout import pack_rows

Tensor = torch.Tensor

REQUIRED_KEYS = ("prompts", "responses", "attention_mask", "response_mask", "old_log_probs", "token_level_rewards")
"""The tensor keys of a verl batch that :func:`sample_batch_from_verl` reads (``ref_log_prob`` too when present)."""


def turn_spans(response_mask: Tensor) -> list[list[tuple[int, int]]]:
    """Per row, the ``(start, end)`` response positions of each run of ones in ``response_mask`` ``[B, R]``, in order."""
    mask = torch.as_tensor(response_mask).to(torch.int8)
    edges = torch.nn.functional.pad(mask, (1, 1)).diff(dim=1)
    spans = []
    for row in edges:
        starts = (row == 1).nonzero().flatten().tolist()
        ends = (row == -1).nonzero().flatten().tolist()
        spans.append(list(zip(starts, ends)))
    return spans


@dataclass(frozen=True)
class TurnLayout:
    """Where each row of :func:`sample_batch_from_verl`'s batch comes from in verl's batch.

    ``row[j]``: the verl row (the trajectory); ``start[j]``, ``end[j]``: the turn's response
    positions ``[start, end)`` (0 and 0 for a placeholder, a turn the trajectory did not take).
    """

    row: Tensor
    start: Tensor
    end: Tensor

    def gather(self, values: Tensor, width: int) -> Tensor:
        """``[n, width]`` per-turn rows of a verl ``[B, R]`` per-response-token tensor (0 past each turn)."""
        out = torch.zeros(self.row.numel(), width, dtype=values.dtype, device=values.device)
        for j, (i, s, e) in enumerate(zip(self.row.tolist(), self.start.tolist(), self.end.tolist())):
            out[j, : e - s] = values[i, s:e]
        return out


def sample_batch_from_verl(data: Any, *, gamma: float = 1.0, pad_token_id: int = 0,
                           dtype: torch.dtype | None = None) -> tuple[SampleBatch, TurnLayout]:
    """The toolkit's one-row-per-(trajectory, turn) batch of a verl batch ``data`` (module docstring).

    Every trajectory gets ``T`` rows, ``T`` its batch's largest number of turns (placeholders,
    ``valid=False``, where it took fewer). A turn's reward is the sum of ``token_level_rewards``
    from its first token to the next turn's (the last turn's to the end of the response, the first
    turn's from the start), so a terminal reward lands on the last turn; ``traj_return`` is
    ``sum_t gamma^t reward_t``. ``group_id`` numbers verl's ``uid`` (a prompt's rollouts) in order
    of appearance. ``logp_old`` comes from ``old_log_probs``, in ``dtype`` (default: its own).
    A missing key, a shape that does not match, or a batch without any turn is a one-line
    ``ValueError`` saying which.
    """
    tensors, extra = data.batch, data.non_tensor_batch
    missing = [k for k in REQUIRED_KEYS if k not in tensors.keys()]
    if missing:
        raise ValueError(f"the verl batch lacks {', '.join(missing)} (a multi-turn agent-loop batch after "
                         "the old-log-prob pass and the reward)")
    if "uid" not in extra:
        raise ValueError("the verl batch lacks non_tensor_batch['uid'] (the prompt group of each row)")
    prompts, responses, response_mask = tensors["prompts"], tensors["responses"], tensors["response_mask"]
    B, P = prompts.shape
    R = responses.shape[1]
    if tensors["attention_mask"].shape != (B, P + R) or response_mask.shape != (B, R):
        raise ValueError(f"attention_mask must be [B, P + R] = [{B}, {P + R}] and response_mask [B, R] = [{B}, {R}]; "
                         f"got {tuple(tensors['attention_mask'].shape)} and {tuple(response_mask.shape)}")
    spans = turn_spans(response_mask)
    if not any(spans):
        raise ValueError("no row of the verl batch has an assistant turn (response_mask is 0 everywhere)")
    T = max(len(s) for s in spans)
    prompt_real = tensors["attention_mask"][:, :P].bool()
    old = tensors["old_log_probs"]
    dtype = dtype or old.dtype
    rewards = tensors["token_level_rewards"].to(dtype)
    contexts, turn_tokens, rows, starts, ends = [], [], [], [], []
    reward = torch.zeros(B * T, dtype=dtype)
    for i, row_spans in enumerate(spans):
        prompt = prompts[i][prompt_real[i]].tolist()
        response = responses[i].tolist()
        for t in range(T):
            rows.append(i)
            if t >= len(row_spans):
                contexts.append([]), turn_tokens.append([]), starts.append(0), ends.append(0)
                continue
            s, e = row_spans[t]
            contexts.append(prompt + response[:s])
            turn_tokens.append(response[s:e])
            starts.append(s), ends.append(e)
            first = 0 if t == 0 else s
            last = row_spans[t + 1][0] if t + 1 < len(row_spans) else R
            reward[i * T + t] = rewards[i, first:last].sum()
    layout = TurnLayout(torch.tensor(rows), torch.tensor(starts), torch.tensor(ends))
    width = max(1, int((layout.end - layout.start).max()))
    token_mask = torch.arange(width)[None, :] < (layout.end - layout.start)[:, None]
    group = _dense_ids(extra["uid"])
    traj_return = (reward.reshape(B, T) * gamma ** torch.arange(T, dtype=dtype)).sum(1)
    batch = SampleBatch(
        traj_id=layout.row.clone(),
        group_id=group[layout.row],
        turn=torch.arange(T).repeat(B),
        logp_old=layout.gather(old.to(dtype), width),
        token_mask=token_mask,
        valid=layout.end > layout.start,
        reward=reward,
        traj_return=traj_return[layout.row],
        weight=torch.ones(B * T, dtype=dtype),
        instance=torch.zeros(B * T, dtype=torch.long),
        data=pack_rows(contexts, turn_tokens, pad_token_id),
    )
    return batch, layout


def sequential_refusal(cfg: AlgorithmConfig) -> str | None:
    """Why :func:`sequential_update` cannot run ``cfg`` inside verl's actor (one line), or ``None``."""
    if adv_estimator(cfg.advantage).needs_critic:
        return (f"advantage={cfg.advantage!r} needs a critic, which the actor's update does not have "
                "(a critic-free estimator: grae, rloo, ...)")
    if not adv_estimator(cfg.advantage).lm:  # the trainer's own check (seeupo.llm.config): exact advantages and the like
        return (f"advantage={cfg.advantage!r} has no language-model form (registered with lm=False: it needs the "
                "exact values of a tabular problem)")
    return None


def sequential_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Any,
    cfg: AlgorithmConfig,
    *,
    temperature: float = 1.0,
    pad_token_id: int = 0,
    gamma: float = 1.0,
    micro_batch_rows: int | None = 8,
    micro_batch_tokens: int | None = None,
    max_grad_norm: float | None = 1.0,
    scoring: str = "packed",
    generator: torch.Generator | None = None,
    dp: DataParallel | None = None,
    owner: Tensor | None = None,
) -> tuple[UpdateStats, dict[str, float]]:
    """``cfg``'s update (sequential or simultaneous) of ``model`` on the verl batch ``data``, by the core.

    :func:`sample_batch_from_verl`, the advantages of ``cfg.advantage`` on it, then
    :func:`seeupo.core.update.policy_update` with :class:`seeupo.llm.policy.CausalLMPolicy` at
    ``temperature`` (verl's rollout temperature) in the ``scoring`` layout; ``ref_log_prob``,
    when ``data`` has it, gives the KL term (``cfg.kl_coef``, ``cfg.kl_estimator``). verl's own
    ``advantages`` are not read: the estimator runs on the per-turn rows. Returns the core's
    :class:`~seeupo.core.update.UpdateStats` (``factor``: ``F[traj]`` the last turn read, by verl
    row) and verl-named metrics (``actor/pg_loss``, ``actor/kl_loss``, ``actor/grad_norm``,
    ``actor/pg_clipfrac``, ``actor/fused_ratio_passes``, ``timing_s/update_actor``, ...).

    With data parallelism (``dp``), ``data`` is the whole batch on every process and ``owner``
    ``[B]`` the process that forwards each verl row (:mod:`seeupo.core.parallel`); the model's
    gradients must then be summed over the processes, not averaged.
    """
    from seeupo.llm.metrics import update_metrics
    from seeupo.llm.policy import CausalLMPolicy

    reason = sequential_refusal(cfg)
    if reason is not None:
        raise ValueError(reason)
    start = time.perf_counter()
    param = next(model.parameters())
    batch, layout = sample_batch_from_verl(data, gamma=gamma, pad_token_id=pad_token_id, dtype=param.dtype)
    if owner is not None:
        batch = batch.with_updates(owner=torch.as_tensor(owner)[layout.row])
    batch = _to(batch, param.device)
    logp_ref = None
    if cfg.kl_coef > 0:
        if "ref_log_prob" not in data.batch.keys():
            raise ValueError(f"kl_coef={cfg.kl_coef} needs the reference log-probs (ref_log_prob) in the verl batch")
        logp_ref = layout.gather(data.batch["ref_log_prob"].to(param.dtype), batch.logp_old.shape[1]).to(param.device)
    advantages = compute_advantages(batch, cfg)
    policy = CausalLMPolicy(model, temperature=temperature, micro_batch_rows=micro_batch_rows,
                            micro_batch_tokens=micro_batch_tokens, scoring=scoring, collective=dp)
    stats = policy_update(policy, optimizer, batch, advantages, cfg, UpdateSettings(
        logp_ref=logp_ref, generator=generator, micro_batch_rows=micro_batch_rows,
        micro_batch_tokens=micro_batch_tokens, row_tokens=batch.data["attention_mask"].sum(1),
        max_grad_norm=max_grad_norm, dp=dp))
    lr = optimizer.param_groups[0]["lr"]
    metrics = update_metrics(batch, stats, torch.zeros(0), lr=lr, prep_s=0.0, update_s=time.perf_counter() - start)
    del metrics["rollout/logp_diff_max"], metrics["timing_s/prep"]  # verl logs its own
    return stats, metrics


def _dense_ids(values: Any) -> Tensor:
    """``[B]`` long: each distinct value of ``values`` numbered in order of first appearance."""
    seen: dict[Any, int] = {}
    return torch.tensor([seen.setdefault(v, len(seen)) for v in np.asarray(values, dtype=object).tolist()])


def _to(batch: SampleBatch, device: torch.device) -> SampleBatch:
    """``batch`` with every tensor on ``device``."""
    if batch.traj_id.device == device:
        return batch
    moved = {k: v.to(device) for k, v in vars(batch).items() if isinstance(v, Tensor)}
    return batch.with_updates(**moved, data={k: v.to(device) for k, v in batch.data.items()})
