"""The bridge: a tabular problem of :mod:`seeupo.tabular` played by a language model, with exact ``J``.

Each action of turn ``t`` is spelled as ``L`` symbols of an alphabet of ``V`` single tokens
(the action's base-``V`` digits, most significant first, ``L`` the smallest length that spells
every action of every turn). The model sees the rules, the initial state and, after each
turn, the observation, as chat messages; it answers each turn with at most ``L`` new tokens.

**Outcome of a turn** (on token ids, never on decoded text, so that the exact ``J`` below is the
``J`` of the sampling policy): a response that is exactly the ``L`` tokens of an action ``a <
A_t`` plays ``a``; anything else (another token, a stop token, a digit string beyond ``A_t``)
is *invalid*: the episode ends with reward ``invalid_reward`` (0 by default) and
``info["invalid"] = True``.

**Exact J.** The action space is finite, so :func:`exact_action_probs` computes the model's
probability of every action at every history by teacher forcing the ``L`` tokens on the exact
context the agent loop builds (:class:`seeupo.llm.agent.ChatDelta`); the probability left over
is the invalid action's. :func:`exact_J` evaluates that policy on the problem *augmented* with
the invalid action (terminal, reward ``invalid_reward``) with the tabular engine, so ``J`` is
the expected return of the language model's sampling policy, computed exactly.

**The J reported is the J trained on**, under three conditions that make the sampler the
policy ``J`` scores and the episode the problem's episode:

* the return is discounted by the problem's ``gamma`` on both sides: ``J`` is
  ``E[sum_t gamma^t r_t]`` and :class:`BridgeEnv` declares ``gamma``, which the agent loop takes
  as the discount of ``traj_return`` (:func:`seeupo.llm.agent.episode_discount`), so the return
  the group-relative presets optimise is the one whose expectation ``J`` is (PPO's GAE discounts
  the per-turn rewards with its own ``algorithm.gae_gamma``, per token by default, which the
  bridge does not set; :func:`bridge_gamma` gives the problem's for a config check);
* sampling uses the full softmax at the policy's temperature (``top_p = 1``): the probabilities
  here, like the policy's log-probabilities and importance ratios, are full-softmax ones, so
  a nucleus-truncated sampler (``top_p < 1``) would play another policy than the ``J`` reported;
* every episode is played to its end: ``rollout.max_turns`` is at least the problem's number of
  turns (:func:`bridge_num_turns`) and ``rollout.max_context`` holds the longest game. An
  episode the agent loop cuts off would be scored 0 from there on, and an answer it cuts at the
  context's end would be scored invalid, neither of which ``J`` counts, so :meth:`BridgeEnv.truncate`
  and :meth:`BridgeEnv.step` refuse them (:class:`~seeupo.validation.errors.InputError` naming the limit).

``J`` is the expectation under the problem's initial-state distribution ``rho``; the training
tasks are ``num_tasks`` draws from ``rho`` (with one initial state, the default, they coincide).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from seeupo.llm.agent import ChatDelta, Message, StepResult
from seeupo.llm.envs import EnvSpec, WarmUp, register_env
from seeupo.tabular.exact import evaluate, optimal
from seeupo.tabular.problems import DTYPE, TreeMDP
from seeupo.validation.errors import InputError
from seeupo.validation.schemas import dataclass_from_dict

Tensor = torch.Tensor


@dataclass(frozen=True)
class Spelling:
    """How actions are written: ``length`` symbols of ``alphabet``, and their token ids."""

    alphabet: tuple[str, ...]
    token_ids: tuple[int, ...]
    length: int

    @classmethod
    def for_problem(cls, problem: TreeMDP, tokenizer: Any, alphabet: tuple[str, ...]) -> "Spelling":
        if len(alphabet) < 2:
            raise ValueError("the bridge needs an alphabet of at least 2 symbols")
        ids = []
        for symbol in alphabet:
            encoded = tokenizer.encode(symbol, add_special_tokens=False)
            if len(encoded) != 1:
                raise ValueError(f"bridge symbol {symbol!r} is {len(encoded)} tokens of this tokenizer; each must be one")
            ids.append(encoded[0])
        if len(set(ids)) != len(ids):
            raise ValueError(f"bridge symbols {alphabet} share token ids")
        special = set(getattr(tokenizer, "all_special_ids", ()))
        if special & set(ids):  # a stop token as a symbol would make an early stop look like a cut answer
            raise ValueError(f"bridge symbols {alphabet} include a special token of this tokenizer")
        length = max(1, max(math.ceil(math.log(a, len(alphabet)) - 1e-12) for a in problem.actions_per_turn))
        return cls(tuple(alphabet), tuple(ids), length)

    def action_ids(self, action: int) -> list[int]:
        digits = []
        for _ in range(self.length):
            action, d = divmod(action, len(self.alphabet))
            digits.append(d)
        return [self.token_ids[d] for d in reversed(digits)]

    def action_text(self, action: int) -> str:
        return "".join(self.alphabet[self.token_ids.index(i)] for i in self.action_ids(action))

    def parse(self, ids: list[int], num_actions: int) -> int | None:
        """The action spelled by exactly these ids, or ``None`` (invalid)."""
        if len(ids) != self.length or any(i not in self.token_ids for i in ids):
            return None
        action = 0
        for i in ids:
            action = action * len(self.alphabet) + self.token_ids.index(i)
        return action if action < num_actions else None


def initial_messages(problem: TreeMDP, spelling: Spelling, s0: int) -> list[Message]:
    symbols = " ".join(spelling.alphabet)
    return [
        {"role": "system", "content": f"A game of {problem.num_turns} turns. Answer each turn with exactly "
                                      f"{spelling.length} symbols from: {symbols}."},
        {"role": "user", "content": f"State {s0}. Turn 1."},
    ]


def observation_text(t: int, o: int, num_observations: int) -> str:
    """The message after turn ``t`` (0-based) with observation ``o``."""
    return f"Observation {o}. Turn {t + 2}." if num_observations > 1 else f"Turn {t + 2}."


class BridgeEnv:
    """One episode of instance 0 of ``problem`` at a time (the agent loop makes one per trajectory).

    ``reset(task)`` takes the initial state ``s0`` (an int); observations are drawn from
    ``generator`` (seed it for reproducible runs). ``gamma`` is the problem's discount: the agent
    loop discounts the episode's return with it, as :func:`exact_J` does.
    """

    def __init__(self, problem: TreeMDP, spelling: Spelling, *, invalid_reward: float = 0.0,
                 generator: torch.Generator | None = None) -> None:
        if problem.num_instances != 1:
            raise ValueError("BridgeEnv plays one instance: pass problem.instance(i)")
        self.problem, self.spelling, self.invalid_reward = problem, spelling, invalid_reward
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.t, self.history = 0, 0

    @property
    def gamma(self) -> float:
        """The discount of the return (the problem's), read by :func:`seeupo.llm.agent.episode_discount`."""
        return float(self.problem.gamma)

    def reset(self, task: int) -> list[Message]:
        self.t, self.history = 0, int(task)
        return initial_messages(self.problem, self.spelling, int(task))

    def step(self, assistant_text: str, token_ids: list[int]) -> StepResult:
        p, t, h = self.problem, self.t, self.history
        ids = list(token_ids)
        if len(ids) < self.spelling.length and all(i in self.spelling.token_ids for i in ids):
            # fewer than L tokens, all symbols: not a stop (the stop token is no symbol) but a response
            # the agent loop cut at the context's end, which might have become a valid action; an
            # invalid move here would not be the J's (a prefix with a non-symbol is invalid either way)
            raise InputError("config.rollout.max_context", f"a bridge answer was cut to {len(ids)} of "
                             f"{self.spelling.length} tokens by the context limit; the exact J assumes whole answers")
        action = self.spelling.parse(ids, p.actions_per_turn[t])
        if action is None:
            return StepResult(None, self.invalid_reward, True, {"invalid": True, "turn": t})
        probs = p.obs_probs[t][0, h, action]
        o = int(torch.multinomial(probs, 1, generator=self.generator)) if probs.numel() > 1 else 0
        reward = float(p.rewards[t][0, h, action, o])
        done = bool(p.terminal[t][0, h, action, o])
        self.history = (h * p.actions_per_turn[t] + action) * p.obs_per_turn[t] + o
        self.t += 1
        obs = None if done else observation_text(t, o, p.obs_per_turn[t])
        return StepResult(obs, reward, done, {"invalid": False, "action": action, "observation": o, "turn": t})

    def truncate(self, outcome: str) -> StepResult | None:
        """Refuse an episode the agent loop cut off before the game ended.

        Why: the exact ``J`` counts every turn of the game; a cut-off episode's return misses the
        rest, so the return trained on would no longer be the one ``J`` is the expectation of.
        ``outcome`` is the agent loop's (``"max_turns"`` or ``"context"``).
        """
        field_name = "config.rollout.max_turns" if outcome == "max_turns" else "config.rollout.max_context"
        raise InputError(field_name, f"a bridge episode was cut off after {self.t} of {self.problem.num_turns} turns "
                                     f"({outcome}); the exact J assumes every game is played to its end")


def with_invalid_action(problem: TreeMDP, invalid_reward: float) -> TreeMDP:
    """``problem`` with one more action per turn (the last): terminal, reward ``invalid_reward``."""
    obs, rew, term = [], [], []
    n = problem.num_initial_states
    for t, (a, o) in enumerate(zip(problem.actions_per_turn, problem.obs_per_turn)):
        I = problem.num_instances
        # histories of the augmented problem that extend an original history keep its tables
        shape = (I, n, a + 1, o)
        p_t = torch.zeros(shape, dtype=DTYPE)
        p_t[..., 0] = 1.0
        r_t = torch.full(shape, float(invalid_reward), dtype=DTYPE)
        e_t = torch.ones(shape, dtype=torch.bool)
        original = _original_index(problem, t)  # [n] original history index or -1
        keep = original >= 0
        p_t[:, keep, :a] = problem.obs_probs[t][:, original[keep]]
        r_t[:, keep, :a] = problem.rewards[t][:, original[keep]]
        e_t[:, keep, :a] = problem.terminal[t][:, original[keep]]
        obs.append(p_t), rew.append(r_t), term.append(e_t)
        n *= (a + 1) * o
    return TreeMDP(problem.initial_state_probs, tuple(a + 1 for a in problem.actions_per_turn), problem.obs_per_turn,
                   obs, rew, term, problem.gamma)


def decode_history(problem: TreeMDP, t: int, h: int) -> tuple[int, list[int], list[int]]:
    """``(s0, actions, observations)`` of flat history ``h`` of turn ``t``."""
    actions, observations = [], []
    for k in reversed(range(t)):
        h, o = divmod(h, problem.obs_per_turn[k])
        h, a = divmod(h, problem.actions_per_turn[k])
        actions.append(a), observations.append(o)
    return h, actions[::-1], observations[::-1]


def _original_index(problem: TreeMDP, t: int) -> Tensor:
    """For each turn-``t`` history of the augmented problem, the original history index (-1: an invalid action was taken)."""
    augmented = [a + 1 for a in problem.actions_per_turn]
    n_aug = problem.num_initial_states * math.prod(a * o for a, o in zip(augmented[:t], problem.obs_per_turn[:t]))
    out = torch.full((n_aug,), -1, dtype=torch.long)
    for h in range(n_aug):
        rest, steps = h, []
        for k in reversed(range(t)):
            rest, o = divmod(rest, problem.obs_per_turn[k])
            rest, a = divmod(rest, augmented[k])
            steps.append((a, o))
        steps.reverse()
        if all(a < problem.actions_per_turn[k] for k, (a, _) in enumerate(steps)):
            out[h] = _reindex(problem, rest, steps)
    return out


def _reindex(problem: TreeMDP, s0: int, steps: list[tuple[int, int]]) -> int:
    h = s0
    for k, (a, o) in enumerate(steps):
        h = (h * problem.actions_per_turn[k] + a) * problem.obs_per_turn[k] + o
    return h


def history_context(chat: ChatDelta, problem: TreeMDP, spelling: Spelling, s0: int, actions: list[int],
                    observations: list[int]) -> list[int]:
    """The token ids of the context the agent loop builds before turn ``len(actions)`` (max_new_tokens = ``L``)."""
    ids = chat.prompt_ids(initial_messages(problem, spelling, s0))
    for k, (a, o) in enumerate(zip(actions, observations)):
        message = {"role": "user", "content": observation_text(k, o, problem.obs_per_turn[k])}
        response = spelling.action_ids(a)
        ids = ids + response + chat.next_ids(response, "length", [message])
    return ids


@torch.no_grad()
def exact_action_probs(policy: Any, tokenizer: Any, problem: TreeMDP, spelling: Spelling) -> list[Tensor]:
    """The language model's action probabilities at every history, per turn ``[1, N_t, A_t + 1]``.

    Column ``A_t`` is the invalid action (the probability of any other response). ``policy`` is
    a :class:`seeupo.llm.policy.CausalLMPolicy` (its temperature is the sampling temperature).
    """
    return [_turn_action_probs(policy, tokenizer, problem, spelling, t) for t in range(problem.num_turns)]


def _turn_action_probs(policy: Any, tokenizer: Any, problem: TreeMDP, spelling: Spelling, t: int) -> Tensor:
    """Turn ``t``'s part of :func:`exact_action_probs`: ``[1, N_t, A_t + 1]``."""
    from seeupo.llm.layout import scoring_batch

    chat = ChatDelta(tokenizer)
    a_t = problem.actions_per_turn[t]
    original = _original_index(problem, t)
    probs = torch.full((1, original.numel(), a_t + 1), 1.0 / (a_t + 1), dtype=DTYPE)
    live = [h for h in range(original.numel()) if original[h] >= 0]
    contexts, responses = [], []
    for h in live:
        s0, actions, observations = decode_history(problem, t, int(original[h]))
        ctx = history_context(chat, problem, spelling, s0, actions, observations)
        for a in range(a_t):
            contexts.append(ctx)
            responses.append(spelling.action_ids(a))
    if live:
        batch = scoring_batch(contexts, responses, tokenizer.pad_token_id or 0, DTYPE)
        action_p = policy.token_logps(batch).to(DTYPE).sum(1).exp().reshape(len(live), a_t)
        probs[0, live, :a_t] = action_p
        probs[0, live, a_t] = (1.0 - action_p.sum(1)).clamp_min(0.0)
    return probs


@torch.no_grad()
def valid_first_answer_prob(policy: Any, tokenizer: Any, problem: TreeMDP, spelling: Spelling) -> float:
    """The exact probability that the language model's first answer is a valid action.

    Enumerated like ``J`` (turn 0 of :func:`exact_action_probs`), averaged over the initial
    states with the problem's ``rho``.
    """
    invalid = _turn_action_probs(policy, tokenizer, problem, spelling, 0)[0, :, -1]  # [N_0]: one row per s0
    return float((problem.initial_state_probs[0].to(DTYPE) * (1.0 - invalid)).sum())


def exact_J(policy: Any, tokenizer: Any, problem: TreeMDP, spelling: Spelling, invalid_reward: float = 0.0) -> tuple[float, float]:
    """``(J, J*)``: the language model's exact expected return, and the optimum of the augmented problem."""
    augmented = with_invalid_action(problem, invalid_reward)
    probs = exact_action_probs(policy, tokenizer, problem, spelling)
    return float(evaluate(augmented, probs).J[0]), float(optimal(augmented).J[0])


@dataclass(frozen=True)
class BridgeOptions:
    """``env.options`` of the bridge (``env.name: bridge``).

    instance: an instance file (format: :mod:`seeupo.tabular.instances`); otherwise a random
      problem of ``kind`` with ``turns``, ``actions``, ``observations`` (tree MDP),
      ``initial_states``, ``reward_levels``, ``terminate_prob`` (tree MDP), drawn with ``problem_seed``.
    alphabet: the symbols that spell actions (each one token of the model's tokenizer).
    gamma: the discount of a random problem (default 1; an instance file carries its own ``gamma``,
      so giving both is refused). ``J`` and the trained-on return are both ``sum_t gamma^t r_t``.
    invalid_reward: the reward of an invalid response (it ends the episode).
    num_tasks: the training tasks are this many initial states drawn from ``rho``.
    warmup_steps, warmup_lr: Adam steps of the format warm-up (the spec's ``warm_up``, which the
      trainer runs before training: supervised steps on uniformly random valid actions, so that a
      random model answers in the format, the analogue of an instruction-tuned start); 0 to skip.
    warmup_target: if set, the warm-up stops as soon as the exact probability of a valid first
      answer (:func:`valid_first_answer_prob`, measured every ``warmup_check_every`` steps and
      before the first) is at least this, and ``warmup_steps`` is a cap; the probability reached
      and the steps taken are logged at step 0 (``bridge/warmup_valid_prob``,
      ``bridge/warmup_steps``). Why: with a random model almost every answer is invalid, every
      return is 0 and a group-relative update has nothing to learn from; a fixed step count
      does not say whether the format was learnt. ``None``: exactly ``warmup_steps`` steps.
    """

    instance: str | None = None
    kind: Literal["sequential_bandit", "tree_mdp"] = "sequential_bandit"
    turns: int = 2
    actions: int = 2
    observations: int = 2
    initial_states: int = 1
    reward_levels: int = 3
    terminate_prob: float = 0.2
    problem_seed: int = 0
    alphabet: tuple[str, ...] = ("a", "b")
    gamma: float | None = None
    invalid_reward: float = 0.0
    num_tasks: int = 64
    warmup_steps: int = 40
    warmup_lr: float = 3e-3
    warmup_target: float | None = None
    warmup_check_every: int = 5

    def __post_init__(self) -> None:
        if self.instance is not None and self.gamma is not None:
            raise ValueError("gamma is the instance file's own: remove env.options.gamma or env.options.instance")


BRIDGE_BOUNDS = {"turns": (1, 6), "actions": (1, 16), "observations": (1, 4), "initial_states": (1, 8),
                 "reward_levels": (2, 1000), "terminate_prob": (0.0, 1.0), "problem_seed": (0, 2**63 - 1), "gamma": (0.0, 1.0),
                 "invalid_reward": (-1e6, 1e6), "num_tasks": (1, 100_000), "warmup_steps": (0, 100_000),
                 "warmup_lr": (0.0, 1.0), "warmup_target": (0.0, 1.0), "warmup_check_every": (1, 100_000)}


def bridge_problem(opts: BridgeOptions) -> TreeMDP:
    """The single-instance problem the options describe."""
    from seeupo.tabular.problems import random_sequential_bandit, random_tree_mdp

    if opts.instance is not None:
        return _instance(opts.instance)
    gen = torch.Generator().manual_seed(opts.problem_seed)
    actions = (opts.actions,) * opts.turns
    if opts.kind == "sequential_bandit":
        problem = random_sequential_bandit(1, actions, num_initial_states=opts.initial_states,
                                           reward_levels=opts.reward_levels, generator=gen)
    else:
        problem = random_tree_mdp(1, actions, (opts.observations,) * opts.turns, num_initial_states=opts.initial_states,
                                  terminate_prob=opts.terminate_prob, reward_levels=opts.reward_levels, generator=gen)
    return problem if opts.gamma is None else dataclasses.replace(problem, gamma=float(opts.gamma))


def bridge_num_turns(options: dict[str, Any]) -> int:
    """The number of turns of the bridge problem ``env.options`` describe, without a model or tokenizer.

    For config checks made before anything expensive: ``rollout.max_turns`` below this cuts every
    game short, and :meth:`BridgeEnv.truncate` would refuse the first cut-off episode. A random
    problem's count is ``turns``; an instance file is read (size-limited by
    :func:`seeupo.tabular.instances.load_problem`). Bad options raise
    :class:`~seeupo.validation.errors.InputError` naming the field.
    """
    from seeupo.llm.config import bridge_shape  # the one reader of a bridge problem's shape

    opts = dataclass_from_dict(BridgeOptions, options, "config.env.options", BRIDGE_BOUNDS)
    return len(bridge_shape(opts)[1])


def bridge_gamma(options: dict[str, Any]) -> float:
    """The discount of the bridge problem ``env.options`` describe (what ``bridge/J`` and the trained-on
    return use), without a model; like :func:`bridge_num_turns`, for config checks (e.g. of an
    algorithm with its own discount, GAE's ``algorithm.gae_gamma``)."""
    opts = dataclass_from_dict(BridgeOptions, options, "config.env.options", BRIDGE_BOUNDS)
    if opts.instance is None:
        return 1.0 if opts.gamma is None else float(opts.gamma)
    return float(_instance(opts.instance).gamma)


def _instance(path: str) -> TreeMDP:
    from seeupo.tabular.instances import load_problem

    return load_problem(path).instance(0)


def random_histories(problem: TreeMDP, count: int, generator: torch.Generator) -> list[tuple[int, int, list[int], list[int]]]:
    """``count`` random ``(t, s0, actions, observations)`` reachable under uniform actions."""
    out = []
    for _ in range(count):
        t = int(torch.randint(problem.num_turns, (1,), generator=generator))
        h = int(torch.multinomial(problem.initial_state_probs[0], 1, generator=generator))
        s0, actions, observations = h, [], []
        for k in range(t):
            a = int(torch.randint(problem.actions_per_turn[k], (1,), generator=generator))
            o = int(torch.multinomial(problem.obs_probs[k][0, h, a], 1, generator=generator))
            if bool(problem.terminal[k][0, h, a, o]):
                break
            actions.append(a), observations.append(o)
            h = (h * problem.actions_per_turn[k] + a) * problem.obs_per_turn[k] + o
        out.append((len(actions), s0, actions, observations))
    return out


def format_examples(chat: ChatDelta, problem: TreeMDP, spelling: Spelling, generator: torch.Generator,
                    batch_size: int = 16) -> tuple[list[list[int]], list[list[int]]]:
    """One batch of the format warm-up: ``(contexts, responses)`` of uniformly random valid answers.

    ``batch_size`` random histories (:func:`random_histories`), each as the context the agent
    loop builds there, answered by a uniformly random action of its turn, spelled. Both are
    drawn from ``generator``: the histories first, then the answers.
    """
    contexts, responses = [], []
    for t, s0, actions, observations in random_histories(problem, batch_size, generator):
        contexts.append(history_context(chat, problem, spelling, s0, actions, observations))
        a = int(torch.randint(problem.actions_per_turn[t], (1,), generator=generator))
        responses.append(spelling.action_ids(a))
    return contexts, responses


@register_env("bridge", options=BridgeOptions, bounds=BRIDGE_BOUNDS)
def make_bridge(opts: BridgeOptions, tokenizer: Any, seed: int) -> EnvSpec:
    """The bridge's :class:`~seeupo.llm.envs.EnvSpec` from ``env.options`` (see :class:`BridgeOptions`).

    With ``warmup_steps > 0`` its ``warm_up`` is the format warm-up: supervised steps on
    :func:`format_examples`, drawn with a generator seeded by ``seed``.
    """
    problem = bridge_problem(opts)
    spelling = Spelling.for_problem(problem, tokenizer, opts.alphabet)
    draws = torch.Generator().manual_seed(seed)
    tasks = torch.multinomial(problem.initial_state_probs[0], opts.num_tasks, replacement=True, generator=draws).tolist()

    def metrics(policy: Any) -> dict[str, float]:
        probs = exact_action_probs(policy, tokenizer, problem, spelling)
        augmented = with_invalid_action(problem, opts.invalid_reward)
        j, j_star = float(evaluate(augmented, probs).J[0]), float(optimal(augmented).J[0])
        return {"bridge/J": j, "bridge/J_star": j_star, "bridge/gap": j_star - j,
                "bridge/valid_prob_turn0": float(1.0 - probs[0][..., -1].mean())}

    warm_up = None
    if opts.warmup_steps > 0:  # the format warm-up: the trainer runs it on the fresh model
        chat = ChatDelta(tokenizer)
        target = None
        if opts.warmup_target is not None:
            target = ("bridge/warmup_valid_prob", lambda policy: valid_first_answer_prob(policy, tokenizer, problem, spelling),
                      opts.warmup_target)
        warm_up = WarmUp(examples=lambda generator: format_examples(chat, problem, spelling, generator),
                         steps=opts.warmup_steps, lr=opts.warmup_lr, seed=seed, metric="bridge/warmup_loglik",
                         target=target, check_every=opts.warmup_check_every)

    return EnvSpec(
        tasks=tasks,
        make=lambda generator: BridgeEnv(problem, spelling, invalid_reward=opts.invalid_reward, generator=generator),
        max_new_tokens=spelling.length,
        metrics=metrics,
        warm_up=warm_up,
    )
