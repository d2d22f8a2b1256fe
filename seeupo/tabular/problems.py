"""Tabular multi-turn problems, batched over instances.

Every problem is a finite-horizon **tree MDP** over histories. A history at turn ``t``
(0-based) is ``h_t = (s0, a_0, o_0, ..., a_{t-1}, o_{t-1})``, stored as a flat index::

    h_0 = s0,    h_{t+1} = (h_t * A_t + a_t) * O_t + o_t,

so turn ``t`` has ``N_t = S0 * prod_{k<t} A_k O_k`` histories and every per-turn table has
shape ``[I, N_t, A_t, O_t]`` for ``I`` instances of the same shape. Because the history
holds the turn index, the turn-``t`` policy is a separate "virtual agent" (docs/method.md §1).

* The **sequential multi-agent bandit** of the paper is the special case with one
  observation per turn, the reward at the last turn only, and no early termination.
* A **tree MDP** adds stochastic observations, per-turn rewards, early termination and a
  discount ``gamma``.
* **Token actions**: the turn-``t`` action is a sequence of ``L_t`` tokens from a vocabulary
  of ``V_t`` (``A_t = V_t ** L_t``, most significant token first), so token-level and
  sequence-level updates differ.
* **Answers of different lengths**: with an ``end_token``, an answer ends at its first end
  token (which it spells, as a language model spells its end-of-sequence token) or after
  ``L_t`` tokens. It keeps the index of its spelling padded with token 0; the other indices
  (a nonzero token after the end) are impossible actions: probability 0 under every policy,
  never optimal. Token-level aggregations then weigh answers by their lengths.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from seeupo.tabular.families import AGENTIC_FAMILIES

Tensor = torch.Tensor
DTYPE = torch.float64


@dataclass
class TreeMDP:
    """A batch of ``I`` tree MDPs of the same shape (see the module docstring for the indexing).

    Attributes:
      initial_state_probs: ``[I, S0]``, the distribution ``rho`` of ``s0``.
      actions_per_turn: ``(A_0, ..., A_{T-1})``.
      obs_per_turn: ``(O_0, ..., O_{T-1})``.
      obs_probs: per turn ``[I, N_t, A_t, O_t]``, ``P(o_t | h_t, a_t)``.
      rewards: per turn ``[I, N_t, A_t, O_t]``, the reward received after ``(h_t, a_t, o_t)``.
      terminal: per turn ``[I, N_t, A_t, O_t]`` bool, the episode ends after ``(h_t, a_t, o_t)``;
        all ``True`` at the last turn.
      gamma: discount per turn; the return is ``sum_t gamma^t r_t``.
      tokens: per turn ``(V_t, L_t)``, how an action is spelled as tokens.
      reward_noise: standard deviation of Gaussian noise added to each reward in sampled rollouts.
      end_token: the token that ends an answer early (see the module docstring); ``None``: every
        turn-``t`` answer has ``L_t`` tokens.
    """

    initial_state_probs: Tensor
    actions_per_turn: tuple[int, ...]
    obs_per_turn: tuple[int, ...]
    obs_probs: list[Tensor]
    rewards: list[Tensor]
    terminal: list[Tensor]
    gamma: float = 1.0
    tokens: tuple[tuple[int, int], ...] | None = None
    reward_noise: float = 0.0
    end_token: int | None = None

    def __post_init__(self) -> None:
        if self.tokens is None:
            self.tokens = tuple((a, 1) for a in self.actions_per_turn)
        for t, ((v, length), a) in enumerate(zip(self.tokens, self.actions_per_turn)):
            if v**length != a:
                raise ValueError(f"turn {t}: {length} tokens from a vocabulary of {v} spell {v**length} actions, not {a}")
        for t in range(self.num_turns):
            expected = (self.num_instances, self.num_histories(t), self.actions_per_turn[t], self.obs_per_turn[t])
            for name in ("obs_probs", "rewards", "terminal"):
                if tuple(getattr(self, name)[t].shape) != expected:
                    raise ValueError(f"{name}[{t}] has shape {tuple(getattr(self, name)[t].shape)}, expected {expected}")
        if not bool(self.terminal[-1].all()):
            raise ValueError("every episode must end at the last turn (terminal[-1] all True)")
        if self.end_token is not None and not all(0 <= self.end_token < v for v, length in self.tokens if length > 1):
            raise ValueError(f"end_token {self.end_token} is not a token of every turn with several tokens: "
                             f"vocabularies {[v for v, _ in self.tokens]}")

    @property
    def num_instances(self) -> int:
        return int(self.initial_state_probs.shape[0])

    @property
    def num_turns(self) -> int:
        return len(self.actions_per_turn)

    @property
    def num_initial_states(self) -> int:
        return int(self.initial_state_probs.shape[1])

    def num_histories(self, t: int) -> int:
        """``N_t``; ``t = T`` gives the number of complete paths (leaves)."""
        return self.num_initial_states * math.prod(a * o for a, o in zip(self.actions_per_turn[:t], self.obs_per_turn[:t]))

    @property
    def max_tokens(self) -> int:
        return max(length for _, length in self.tokens)

    def answer_lengths(self, t: int) -> Tensor:
        """``[A_t]`` long: how many tokens each turn-``t`` action spells (``L_t`` without an ``end_token``)."""
        vocab, length = self.tokens[t]
        if self.end_token is None or length == 1:
            return torch.full((vocab**length,), length, dtype=torch.long)
        _, token = token_digits(torch.arange(vocab**length), vocab, length)
        ends = token[:, :-1] == self.end_token  # the last token ends the answer whatever it is
        return torch.where(ends.any(1), ends.long().argmax(1), length - 1) + 1

    def possible_actions(self, t: int) -> Tensor:
        """``[A_t]`` bool: the actions a policy can play (all without an ``end_token``; see the module docstring)."""
        vocab, length = self.tokens[t]
        _, token = token_digits(torch.arange(vocab**length), vocab, length)
        after_end = torch.arange(length)[None, :] >= self.answer_lengths(t)[:, None]
        return ~(after_end & (token != 0)).any(1)

    def instance(self, i: int) -> "TreeMDP":
        """The single-instance problem ``i`` (a batch of one)."""
        return dataclasses.replace(
            self,
            initial_state_probs=self.initial_state_probs[i : i + 1],
            obs_probs=[x[i : i + 1] for x in self.obs_probs],
            rewards=[x[i : i + 1] for x in self.rewards],
            terminal=[x[i : i + 1] for x in self.terminal],
        )


def token_digits(actions: Tensor, vocab: int, length: int) -> tuple[Tensor, Tensor]:
    """``(prefix, token)``, each ``[..., L]``: the prefix index before token ``j`` and token ``j`` of each action."""
    powers = vocab ** torch.arange(length - 1, -1, -1)  # V^(L-1), ..., 1
    prefix = actions[..., None] // (powers * vocab)
    token = (actions[..., None] // powers) % vocab
    return prefix, token


def sequential_bandit(
    initial_state_probs: Tensor,
    actions_per_turn: tuple[int, ...],
    rewards: Tensor,
    *,
    tokens: tuple[tuple[int, int], ...] | None = None,
    reward_noise: float = 0.0,
) -> TreeMDP:
    """The paper's sequentially executed multi-agent bandit, batched.

    Args:
      initial_state_probs: ``[I, S0]`` (or ``[S0]`` for one instance).
      actions_per_turn: ``(A_0, ..., A_{T-1})``.
      rewards: ``[I, S0, A_0, ..., A_{T-1}]`` (or without the leading ``I``): the common reward
        of the joint action, received at the end.
    """
    rho = torch.as_tensor(initial_state_probs, dtype=DTYPE)
    r = torch.as_tensor(rewards, dtype=DTYPE)
    if rho.dim() == 1:
        rho, r = rho[None], r[None]
    num_inst, num_turns = rho.shape[0], len(actions_per_turn)
    expected = (num_inst, rho.shape[1], *actions_per_turn)
    if tuple(r.shape) != expected:
        raise ValueError(f"rewards has shape {tuple(r.shape)}, expected {expected}")
    obs, rew, term = [], [], []
    n = rho.shape[1]
    for t, a in enumerate(actions_per_turn):
        last = t == num_turns - 1
        obs.append(torch.ones(num_inst, n, a, 1, dtype=DTYPE))
        rew.append(r.reshape(num_inst, n, a, 1) if last else torch.zeros(num_inst, n, a, 1, dtype=DTYPE))
        term.append(torch.full((num_inst, n, a, 1), last))
        n *= a
    return TreeMDP(rho, tuple(actions_per_turn), (1,) * num_turns, obs, rew, term, 1.0, tokens, reward_noise)


def _random_rewards(shape: tuple[int, ...], levels: int | None, generator: torch.Generator) -> Tensor:
    """Uniform on [0, 1] (``levels=None``) or uniform on ``levels`` evenly spaced values in [0, 1]."""
    if levels is None:
        return torch.rand(shape, generator=generator, dtype=DTYPE)
    if levels < 2:
        raise ValueError(f"reward levels must be >= 2 (2 = binary rewards), got {levels}")
    return torch.randint(0, levels, shape, generator=generator).to(DTYPE) / (levels - 1)


def _random_simplex(shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """Rows drawn uniformly from the simplex (normalised exponentials), over the last axis."""
    x = -torch.log(torch.rand(shape, generator=generator, dtype=DTYPE).clamp_min(1e-12))
    return x / x.sum(-1, keepdim=True)


def random_sequential_bandit(
    num_instances: int,
    actions_per_turn: tuple[int, ...],
    *,
    num_initial_states: int = 1,
    reward_levels: int | None = None,
    tokens: tuple[int, int] | None = None,
    end_token: int | None = None,
    generator: torch.Generator | None = None,
) -> TreeMDP:
    """Random sequential bandits; with ``tokens=(V, L)`` every action is ``L`` tokens (``A_t = V**L``), and with
    an ``end_token`` as many as it takes to spell that token (answers of different lengths)."""
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    if tokens is not None:
        actions_per_turn = tuple(tokens[0] ** tokens[1] for _ in actions_per_turn)
    rho = _random_simplex((num_instances, num_initial_states), gen)
    rewards = _random_rewards((num_instances, num_initial_states, *actions_per_turn), reward_levels, gen)
    token_spec = tuple(tokens for _ in actions_per_turn) if tokens is not None else None
    problem = sequential_bandit(rho, tuple(actions_per_turn), rewards, tokens=token_spec)
    return dataclasses.replace(problem, end_token=end_token) if end_token is not None else problem


def random_token_bandit(
    num_instances: int,
    num_turns: int,
    vocab_size: int,
    length: int,
    *,
    reward_levels: int | None = None,
    end_token: int | None = None,
    generator: torch.Generator | None = None,
) -> TreeMDP:
    """A sequential bandit whose actions are ``length`` tokens from ``vocab_size`` (at most ``length``, ending at
    ``end_token``, when one is given)."""
    return random_sequential_bandit(num_instances, (1,) * num_turns, reward_levels=reward_levels,
                                    tokens=(vocab_size, length), end_token=end_token, generator=generator)


def random_tree_mdp(
    num_instances: int,
    actions_per_turn: tuple[int, ...],
    obs_per_turn: tuple[int, ...],
    *,
    num_initial_states: int = 1,
    terminate_prob: float = 0.2,
    per_turn_rewards: bool = True,
    gamma: float = 1.0,
    reward_levels: int | None = None,
    generator: torch.Generator | None = None,
) -> TreeMDP:
    """Random tree MDPs: random observation kernels, rewards, and early termination.

    Each non-final ``(h, a, o)`` ends the episode with probability ``terminate_prob``; rewards
    are drawn for every turn if ``per_turn_rewards`` else only where an episode ends.
    """
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    rho = _random_simplex((num_instances, num_initial_states), gen)
    obs, rew, term = [], [], []
    num_turns = len(actions_per_turn)
    n = num_initial_states
    for t, (a, o) in enumerate(zip(actions_per_turn, obs_per_turn)):
        shape = (num_instances, n, a, o)
        obs.append(_random_simplex(shape, gen))
        ends = torch.rand(shape, generator=gen) < terminate_prob if t < num_turns - 1 else torch.ones(shape, dtype=torch.bool)
        r = _random_rewards(shape, reward_levels, gen)
        rew.append(r if per_turn_rewards else torch.where(ends, r, torch.zeros_like(r)))
        term.append(ends)
        n *= a * o
    return TreeMDP(rho, tuple(actions_per_turn), tuple(obs_per_turn), obs, rew, term, gamma)



def stop_or_continue(
    stop_reward: float, continue_reward: float, final_rewards: tuple[float, ...] | list[float]
) -> TreeMDP:
    """The smallest agentic problem: stop now, or take an intermediate reward and act once more.

    Turn 0 has two actions: ``0`` stops (reward ``stop_reward``, the episode ends) and ``1``
    continues (reward ``continue_reward``); turn 1 then chooses among ``len(final_rewards)``
    actions, action ``k`` earning ``final_rewards[k]``. One instance, one initial state,
    deterministic outcomes; ``J* = max(stop_reward, continue_reward + max(final_rewards))``.
    Turn counts vary within a group (1 or 2 turns), the case that separates per-turn
    estimators (docs/tutorial.md, the agentic chapter).
    """
    finals = torch.as_tensor(list(final_rewards), dtype=DTYPE)
    k = finals.numel()
    if k < 1:
        raise ValueError("final_rewards needs at least one action")
    rewards = [torch.tensor([stop_reward, continue_reward], dtype=DTYPE).reshape(1, 1, 2, 1),
               finals.repeat(2).reshape(1, 2, k, 1)]  # turn-1 history 0 follows 'stop': never reached
    terminal = [torch.tensor([True, False]).reshape(1, 1, 2, 1), torch.ones(1, 2, k, 1, dtype=torch.bool)]
    obs = [torch.ones(1, 1, 2, 1, dtype=DTYPE), torch.ones(1, 2, k, 1, dtype=DTYPE)]
    return TreeMDP(torch.ones(1, 1, dtype=DTYPE), (2, k), (1, 1), obs, rewards, terminal)


def random_agentic_mdp(
    num_instances: int,
    num_turns: int,
    *,
    actions: int = 2,
    observations: int = 1,
    intermediate_rewards: bool = True,
    tokens: tuple[int, int] | None = None,
    reward_levels: int | None = None,
    generator: torch.Generator | None = None,
) -> TreeMDP:
    """Random agentic problems: the agent stops when it chooses, with intermediate rewards and tool results.

    At every turn but the last, action 0 stops: the episode ends with a final reward drawn for
    that history. Any other action continues: it earns an intermediate reward (drawn; 0 without
    ``intermediate_rewards``) and the environment answers with one of ``observations`` results
    drawn from a random kernel (a tool's result; 1 = deterministic). At the last turn every
    action ends the episode with a drawn final reward. ``tokens=(V, L)`` spells each action as
    ``L`` tokens from a vocabulary of ``V`` (``actions`` is then ``V**L``; the stop action is
    the all-zero sequence). Undiscounted; rewards uniform on [0, 1] or on ``reward_levels``
    levels. :data:`AGENTIC_FAMILIES` names the settings the toolkit checks.
    """
    if num_turns < 1:
        raise ValueError(f"num_turns must be >= 1, got {num_turns}")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    if tokens is not None:
        actions = tokens[0] ** tokens[1]
    if actions < 2:
        raise ValueError(f"an agentic problem needs at least 2 actions (stop and continue), got {actions}")
    rho = torch.ones(num_instances, 1, dtype=DTYPE)
    obs, rew, term = [], [], []
    n = 1
    for t in range(num_turns):
        last = t == num_turns - 1
        o = 1 if last else observations
        shape = (num_instances, n, actions, o)
        ends = torch.ones(shape, dtype=torch.bool)
        if not last:
            ends[:, :, 1:, :] = False
        final = _random_rewards((num_instances, n, actions, 1), reward_levels, gen).expand(shape)
        step = _random_rewards((num_instances, n, actions, 1), reward_levels, gen).expand(shape)
        r = torch.where(ends, final, step if intermediate_rewards else torch.zeros(shape, dtype=DTYPE))
        obs.append(_random_simplex(shape, gen))
        rew.append(r.clone())
        term.append(ends)
        n *= actions * o
    token_spec = (tokens,) * num_turns if tokens is not None else None
    return TreeMDP(rho, (actions,) * num_turns, tuple(1 if t == num_turns - 1 else observations for t in range(num_turns)),
                   obs, rew, term, 1.0, token_spec)


def random_family(family: str, num_instances: int, num_turns: int, *, reward_levels: int | None = None,
                  generator: torch.Generator | None = None) -> TreeMDP:
    """Random problems of the named agentic family (:data:`AGENTIC_FAMILIES`)."""
    if family not in AGENTIC_FAMILIES:
        raise ValueError(f"unknown problem family {family!r}; expected one of {list(AGENTIC_FAMILIES)}")
    return random_agentic_mdp(num_instances, num_turns, reward_levels=reward_levels, generator=generator,
                              **AGENTIC_FAMILIES[family])  # type: ignore[arg-type]
