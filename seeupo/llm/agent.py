"""The multi-turn agent loop: environments, chat turns as token ids, and the turn-level ``SampleBatch``.

Token-in/token-out: each trajectory's context is a growing list of token ids. The initial
messages are rendered with the tokenizer's chat template and encoded once; every later piece
(the end of the assistant turn, the observation message, the next generation prompt) is encoded
on its own from the template's *delta* (:class:`ChatDelta`); earlier turns are never re-encoded,
and the sampled response ids go into the context unchanged. So the ids the trainer scores are
exactly the ids the engine sampled, and ``logp_old`` is the engine's log-probability of them.

Limits and how an episode ends (``EpisodeRecord.outcome``):

* ``"done"``: the environment said so.
* ``"max_turns"``: ``max_turns`` responses were sampled without the environment ending the episode.
* ``"context"``: the context reached ``max_context`` tokens — a response is cut at the remaining
  room (its ``finish_reason`` becomes ``"length"``; a prefix of a sample is a sample of the
  prefix, so its log-probabilities stay valid), or the next observation does not fit with room for
  at least one token. The environment still scores the last (possibly cut) response.

Truncated episodes are not bootstrapped: the return is the (discounted) sum of the rewards received.
The per-turn token budget is ``SamplingParams.max_new_tokens``.

The discount of the return, ``traj_return = sum_t gamma^t r_t``, has one source: an environment
that defines a discount (an attribute ``gamma``, e.g. the bridge's problem) sets it, so the return
the trainer optimises is the quantity whose exact expectation the environment reports (the bridge's
``J``); otherwise ``gamma = 1``. A caller's ``gamma`` that contradicts the environment's is refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from seeupo.core.batch import SampleBatch
from seeupo.llm.layout import pack_rows
from seeupo.llm.rollout import Completion, RolloutEngine, SamplingParams

Tensor = torch.Tensor
Message = dict[str, str]


@dataclass
class StepResult:
    """The environment's answer to one assistant turn.

    ``observation`` (``None``: nothing to say) becomes the next user/tool message; ``reward`` is
    this turn's reward; ``done`` ends the episode.
    """

    observation: str | None
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


class Environment(Protocol):
    """A multi-turn task. One instance per trajectory (it may keep state between turns)."""

    def reset(self, task: Any) -> list[Message]:
        """Start an episode of ``task``; return the initial chat messages (``{"role", "content"}`` dicts)."""
        ...

    def step(self, assistant_text: str, token_ids: list[int]) -> StepResult:
        """React to the assistant's response: its decoded text (special tokens removed) and the
        sampled token ids (an environment that judges tokens, like the bridge, needs them)."""
        ...

    # Optional: ``gamma: float``, the discount of this environment's return (see the module docstring).
    # Optional: ``truncate(outcome: str) -> StepResult | None``, called when the agent loop ends an
    # episode the environment has not ended (``outcome`` is ``"max_turns"`` or ``"context"``); its
    # reward is added to the last turn's and its info merged into that turn's (e.g. BFCL scores
    # the truncated episode with the checker).


class NoPromptFits(ValueError):
    """Every prompt of a rollout is at least ``max_context`` tokens: nothing could be sampled."""


@dataclass(frozen=True)
class AgentLimits:
    """Episode limits (the per-turn token budget is ``SamplingParams.max_new_tokens``).

    Attributes:
      max_turns: at most this many assistant turns per episode.
      max_context: at most this many tokens in a trajectory's context (prompt + all turns).
      observation_role: the chat role of environment observations (``"user"`` or ``"tool"``).
    """

    max_turns: int = 4
    max_context: int = 2048
    observation_role: str = "user"


class ChatDelta:
    """Encodes only what a new message adds to a conversation, using an append-only chat template.

    ``close`` is the text the template puts after an assistant message's content (ChatML:
    ``"<|im_end|>\\n"``); ``delta(messages)`` is what rendering ``history + messages`` (with the
    generation prompt) adds after a history that ends with an assistant message. Both are found
    by rendering a probe conversation, so any template with that append-only property works; a
    template that rewrites earlier turns raises ``ValueError``.
    """

    _PROBE_CONTENT = "\x00probe\x00"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._probe = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": self._PROBE_CONTENT},
        ]
        self._base = self.render(self._probe, add_generation_prompt=False)
        self.close = self._base[self._base.rindex(self._PROBE_CONTENT) + len(self._PROBE_CONTENT) :]

    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The initial context: the messages rendered with the generation prompt, encoded once."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def delta_text(self, messages: list[Message]) -> str:
        full = self.render(self._probe + messages, add_generation_prompt=True)
        if not full.startswith(self._base):
            raise ValueError("the chat template is not append-only: appending a message changes earlier text")
        return full[len(self._base) :]

    def closing_text(self, response_ids: list[int], finish_reason: str) -> str:
        """What still closes the assistant turn after the sampled ids (the stop token is already there)."""
        if finish_reason == "stop" and response_ids:
            stop_text = self.tokenizer.decode(response_ids[-1:])
            if self.close.startswith(stop_text):
                return self.close[len(stop_text) :]
        return self.close

    def next_ids(self, response_ids: list[int], finish_reason: str, messages: list[Message]) -> list[int]:
        """Ids to append after a sampled response: its closing, ``messages``, and the next generation prompt."""
        return self.encode(self.closing_text(response_ids, finish_reason) + self.delta_text(messages))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


@dataclass
class TurnRecord:
    """One sampled turn, for logging."""

    traj_id: int
    group_id: int
    turn: int
    context_tokens: int
    response_text: str
    response_tokens: int
    finish_reason: str
    observation: str | None
    reward: float
    done: bool
    info: dict


@dataclass
class EpisodeRecord:
    """One trajectory: how many turns, its return, and how it ended (``"done" | "max_turns" | "context"``)."""

    traj_id: int
    group_id: int
    task: Any
    num_turns: int
    traj_return: float
    outcome: str
    messages: list[Message] = field(default_factory=list)  # the initial chat messages (the prompt)


@dataclass
class AgentRollout:
    """The training batch and the logs of one rollout phase; ``gamma``: the discount of its returns."""

    batch: SampleBatch
    turns: list[TurnRecord]
    episodes: list[EpisodeRecord]
    gamma: float = 1.0


def _with(params: SamplingParams, **changes) -> SamplingParams:
    return dataclasses.replace(params, **changes)


def run_episodes(
    engine: RolloutEngine,
    tokenizer,
    env_factory: Callable[[], Environment],
    tasks: list[Any],
    group_size: int,
    params: SamplingParams,
    limits: AgentLimits = AgentLimits(),
    *,
    gamma: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> AgentRollout:
    """Roll out ``len(tasks) x group_size`` multi-turn episodes and build the turn-level batch.

    Trajectory ``b * group_size + g`` is the ``g``-th rollout of ``tasks[b]`` (``group_id = b``).
    All live trajectories sample a turn in one engine call. The batch has ``T`` rows per
    trajectory, ``T`` the largest number of turns any trajectory took, trajectory-major
    (row ``traj * T + t``); rows after a trajectory's end are placeholders (``valid=False``,
    no tokens, reward 0), as in :mod:`seeupo.tabular.rollout`.

    Batch contents: ``logp_old [n, L]`` the engine's log-probabilities of the sampled tokens
    (``L`` the longest response), ``token_mask`` the response tokens, ``reward`` the turn's
    reward, ``traj_return = sum_t gamma^t r_t``, ``weight = 1``, ``instance = 0``, and ``data`` in
    :mod:`seeupo.llm.layout`'s layout (row context + response ids). Float fields are ``dtype``.

    ``gamma``: ``None`` takes the environments' discount (:func:`episode_discount`); a number must
    equal it (``ValueError`` otherwise), so a return is never discounted other than the
    environment's reported objective.
    """
    if limits.max_turns < 1:
        raise ValueError("max_turns must be >= 1")
    chat = ChatDelta(tokenizer)
    n_traj = len(tasks) * group_size
    envs = [env_factory() for _ in range(n_traj)]
    gamma = episode_discount(envs, gamma)
    group = [k // group_size for k in range(n_traj)]
    initial = [envs[k].reset(tasks[group[k]]) for k in range(n_traj)]
    context = [chat.prompt_ids(messages) for messages in initial]
    outcome: list[str | None] = [None] * n_traj
    rows: dict[tuple[int, int], tuple[list[int], Completion, float]] = {}
    rewards: list[list[float]] = [[] for _ in range(n_traj)]
    turns: list[TurnRecord] = []

    for t in range(limits.max_turns):
        live = [k for k in range(n_traj) if outcome[k] is None]
        for k in live:
            if len(context[k]) >= limits.max_context:
                outcome[k] = "context"
        live = [k for k in live if outcome[k] is None]
        if not live:
            break
        room = {k: limits.max_context - len(context[k]) for k in live}
        turn_params = _with(
            params,
            max_new_tokens=min(params.max_new_tokens, max(room.values())),
            seed=None if params.seed is None else params.seed + 1_000_003 * t,
        )
        shared = t == 0 and all(context[k] == context[group[k] * group_size] for k in range(n_traj))
        if shared:
            # the rollouts of a task share its prompt: one prompt, group_size samples (an engine
            # can reuse the prompt's cache); not when reset() gives rollouts different prompts
            firsts = [b * group_size for b in range(len(tasks))]
            sampled = engine.generate([context[k] for k in firsts], group_size, turn_params)
            completions = {b * group_size + g: c for b, group_c in enumerate(sampled) for g, c in enumerate(group_c)}
        else:
            sampled = engine.generate([context[k] for k in live], 1, turn_params)
            completions = {k: c[0] for k, c in zip(live, sampled)}
        for k in live:
            comp = completions[k]
            if len(comp.token_ids) > room[k]:
                comp = Completion(comp.token_ids[: room[k]], comp.logprobs[: room[k]], "length")
            text = tokenizer.decode(comp.token_ids, skip_special_tokens=True)
            result = envs[k].step(text, list(comp.token_ids))
            rows[(k, t)] = (list(context[k]), comp, float(result.reward))
            rewards[k].append(float(result.reward))
            turns.append(
                TurnRecord(k, group[k], t, len(context[k]), text, len(comp.token_ids), comp.finish_reason,
                           result.observation, float(result.reward), bool(result.done), dict(result.info))
            )
            if result.done:
                outcome[k] = "done"
                continue
            if t == limits.max_turns - 1:
                outcome[k] = "max_turns"
                continue
            messages = [] if result.observation is None else [
                {"role": limits.observation_role, "content": result.observation}
            ]
            extra = chat.next_ids(comp.token_ids, comp.finish_reason, messages)
            if len(context[k]) + len(comp.token_ids) + len(extra) >= limits.max_context:
                outcome[k] = "context"
                continue
            context[k] = context[k] + comp.token_ids + extra

    for k in range(n_traj):  # episodes the loop ended: the environment may still score them
        truncate = getattr(envs[k], "truncate", None)
        if outcome[k] == "done" or not rewards[k] or truncate is None:
            continue
        result = truncate(outcome[k] or "max_turns")
        if result is not None:
            t = len(rewards[k]) - 1
            ctx, comp, r = rows[(k, t)]
            rows[(k, t)] = (ctx, comp, r + float(result.reward))
            rewards[k][t] += float(result.reward)
            record = next(x for x in reversed(turns) if x.traj_id == k)
            record.reward += float(result.reward)
            record.info.update(result.info)

    num_turns = [len(r) for r in rewards]
    T = max(num_turns)
    if T == 0:
        raise NoPromptFits(f"no episode sampled a turn: every prompt has >= max_context={limits.max_context} tokens")
    batch = _build_batch(rows, rewards, group, T, tokenizer.pad_token_id, gamma, dtype)
    episodes = [
        EpisodeRecord(k, group[k], tasks[group[k]], num_turns[k], float(batch.traj_return[k * T]), outcome[k] or "max_turns",
                      initial[k])
        for k in range(n_traj)
    ]
    return AgentRollout(batch, turns, episodes, gamma)


def episode_discount(envs: list[Environment], gamma: float | None = None) -> float:
    """The discount of the returns of ``envs``: their ``gamma`` attribute, or 1 when none defines one.

    Why one source: an environment with a discount (the bridge) reports an exact objective that is
    discounted; a return discounted otherwise would train on another objective than the reported one.
    ``gamma`` (a caller's value) must agree with the environments'; environments that disagree
    among themselves are refused too.
    """
    declared = {float(g) for g in (getattr(env, "gamma", None) for env in envs) if g is not None}
    if len(declared) > 1:
        raise ValueError(f"the environments of one rollout declare different discounts {sorted(declared)}")
    if declared:
        (own,) = declared
        if gamma is not None and float(gamma) != own:
            raise ValueError(f"gamma={gamma} contradicts the environment's discount {own}")
        gamma = own
    gamma = 1.0 if gamma is None else float(gamma)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    return gamma


def _build_batch(
    rows: dict[tuple[int, int], tuple[list[int], Completion, float]],
    rewards: list[list[float]],
    group: list[int],
    T: int,
    pad_token_id: int | None,
    gamma: float,
    dtype: torch.dtype,
) -> SampleBatch:
    n_traj = len(rewards)
    n = n_traj * T
    L = max(len(comp.token_ids) for _, comp, _ in rows.values())
    contexts: list[list[int]] = []
    responses: list[list[int]] = []
    logp_old = torch.zeros(n, L, dtype=dtype)
    token_mask = torch.zeros(n, L, dtype=torch.bool)
    valid = torch.zeros(n, dtype=torch.bool)
    reward = torch.zeros(n, dtype=dtype)
    for k in range(n_traj):
        for t in range(T):
            i = k * T + t
            if (k, t) not in rows:
                contexts.append([])
                responses.append([])
                continue
            ctx, comp, r = rows[(k, t)]
            m = len(comp.token_ids)
            contexts.append(ctx)
            responses.append(comp.token_ids)
            logp_old[i, :m] = torch.tensor(comp.logprobs, dtype=dtype)
            token_mask[i, :m] = True
            valid[i] = True
            reward[i] = r
    discount = torch.tensor([gamma**t for t in range(T)], dtype=dtype)
    traj_return = (reward.reshape(n_traj, T) * discount).sum(1)
    rep = lambda x: x.repeat_interleave(T)  # noqa: E731
    return SampleBatch(
        traj_id=rep(torch.arange(n_traj)),
        group_id=rep(torch.tensor(group, dtype=torch.long)),
        turn=torch.arange(T).repeat(n_traj),
        logp_old=logp_old,
        token_mask=token_mask,
        valid=valid,
        reward=reward,
        traj_return=rep(traj_return),
        weight=torch.ones(n, dtype=dtype),
        instance=torch.zeros(n, dtype=torch.long),
        data=pack_rows(contexts, responses, pad_token_id if pad_token_id is not None else 0),
    )
