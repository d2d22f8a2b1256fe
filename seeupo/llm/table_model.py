"""A "language model" whose logits come from a tabular policy's table: the LLM path, checked exactly.

:class:`TableLM` is a ``torch.nn.Module`` with the call signature of a Hugging Face causal LM
(``model(input_ids=, attention_mask=, position_ids=, logits_to_keep=)`` returning ``.logits
[B, C, V]``) whose parameters are the logits table of a
:class:`seeupo.tabular.policies.TabularPolicy` (independent parameterisation). At each position
it reads the history from the context ids of the bridge's chat layout
(:func:`seeupo.llm.envs.bridge.history_context`): if the tokens so far are the exact context of
history ``h`` of turn ``t`` followed by ``j`` symbols of the alphabet, the next-token logits are
``temperature * table[t][j][h, prefix]`` on the alphabet's tokens and ``-inf`` elsewhere, so the
model's sampling distribution ``softmax(logits / temperature)`` over a turn's response is the
tabular policy's distribution over that turn's actions. Any other position gets logits 0 (the
uniform distribution over the whole vocabulary): a position that should never be scored, so
that a misaligned ``logp_old`` or ``token_mask`` shows up as a wrong log-probability.

Run through the trainer (agent loop, :class:`seeupo.llm.policy.CausalLMPolicy`,
:func:`seeupo.core.policy_update`) with :class:`TableEngine` as the rollout engine, it makes
exactly the parameter update the tabular engine makes on the same rollout
(``tests/llm/test_cross_layer.py``): use it to validate changes to the LLM path.

Correspondence (checked by :meth:`TableLM.from_policy`): the bridge spells every action with
``L`` symbols (``Spelling.length``); the tabular problem must spell each turn with the same
``L`` tokens: ``problem.tokens[t] == (V_t, L)`` with ``V_t == len(alphabet)`` when ``L > 1``
(both spell actions in base ``V``, most significant digit first), or ``V_t = A_t <=
len(alphabet)`` when ``L == 1`` (symbols beyond ``A_t`` get ``-inf``). So a response is never
invalid and the bridge's invalid action has probability 0.

Parameters mirror ``TabularPolicy.logits``, one tensor per (turn, token position), and a forward
pass only reads the tables of the positions it returns logits for, so the tables of turns a batch
does not score get no gradient (``None``). That matters for Adam-type optimizers: a tensor with a
zero gradient still moves by its momentum and advances its step counter, one with ``None`` is left
alone. Neither layer scores placeholder rows, so a minibatch whose rows of some turn are all
placeholders (several minibatches, episodes of different lengths) leaves that turn's tables alone
on both sides.

For a critic, ``base_model`` is a backbone whose hidden state is the one-hot index of the state
(:attr:`TableLM.states`; the last index for any other position), so
:meth:`seeupo.llm.policy.ValueModel.from_causal_lm` builds a tabular critic whose head weights are
the values of the states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from seeupo.llm.rollout import Completion, SamplingParams

Tensor = torch.Tensor


@dataclass
class TableLMOutput:
    """What a causal LM returns, as far as the LLM path reads it."""

    logits: Tensor  # [B, K, V]


@dataclass
class TableBackboneOutput:
    last_hidden_state: Tensor  # [B, C, H]


class _Trie:
    """Token-id prefixes of every state's context; ``walk`` gives the state at each position."""

    def __init__(self) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.state: list[int] = [-1]

    def add(self, ids: list[int], state: int) -> None:
        node = 0
        for tok in ids:
            nxt = self.children[node].get(tok)
            if nxt is None:
                nxt = len(self.children)
                self.children[node][tok] = nxt
                self.children.append({})
                self.state.append(-1)
            node = nxt
        if self.state[node] != -1:
            raise ValueError("two bridge states share a context: the history cannot be read from the ids")
        self.state[node] = state

    def walk(self, ids: list[int]) -> list[int]:
        """The state after each prefix ``ids[:p + 1]`` (-1: not a state)."""
        out, node = [], 0
        for tok in ids:
            node = self.children[node].get(tok, -1) if node >= 0 else -1
            out.append(self.state[node] if node >= 0 else -1)
        return out


def _decode(trie: _Trie, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None) -> Tensor:
    """``[B, C]`` state index at every position (-1: padding or not a state).

    The real tokens of a row (``attention_mask == 1``; left or right padding) are read in order;
    their position ids, when given, must count ``0, 1, ...`` (a causal LM would otherwise see
    shifted positions).
    """
    ids = input_ids.cpu()
    mask = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.cpu().bool()
    out = torch.full(ids.shape, -1, dtype=torch.long)
    for b in range(ids.shape[0]):
        real = mask[b].nonzero().squeeze(1)
        if real.numel() == 0:
            continue
        if position_ids is not None:
            pos = position_ids[b].cpu()[real]
            if not torch.equal(pos, torch.arange(real.numel(), dtype=pos.dtype)):
                raise ValueError(f"TableLM: the position ids of row {b}'s real tokens are {pos.tolist()}, not 0, 1, ...")
        out[b, real] = torch.tensor(trie.walk(ids[b, real].tolist()), dtype=torch.long)
    return out.to(input_ids.device)


class TableBackbone(torch.nn.Module):
    """The critic's backbone: hidden state = one-hot state index (``hidden_size = len(states) + 1``)."""

    def __init__(self, trie: _Trie, num_states: int, dtype: torch.dtype) -> None:
        super().__init__()
        self._trie = trie
        self.num_states = num_states
        # a parameter (the critic's dtype and device come from it); identity: one-hot hidden states
        self.embedding = torch.nn.Parameter(torch.eye(num_states + 1, dtype=dtype))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                **_: Any) -> TableBackboneOutput:
        state = _decode(self._trie, input_ids, attention_mask, position_ids)
        return TableBackboneOutput(self.embedding[torch.where(state >= 0, state, self.num_states)])


class TableLM(torch.nn.Module):
    """A causal "LM" over a bridge problem whose logits are a tabular policy's table (module docstring).

    Build it with :meth:`from_policy`. ``states[s] = (t, h, j, prefix)``: the state before token
    ``j`` of the turn-``t`` response at history ``h`` after the prefix index ``prefix`` of the
    first ``j`` tokens (base ``V_t``, as :func:`seeupo.tabular.policies.token_digits`).
    """

    # one table per (turn, token position), as TabularPolicy: a turn's rows use its own tables only
    # (seeupo.core.update.Policy: no fused ratio passes)
    turns_share_parameters = False

    def __init__(self, problem: Any, tokenizer: Any, spelling: Any, tables: list[Tensor], *,
                 temperature: float = 1.0) -> None:
        super().__init__()
        from seeupo.llm.agent import ChatDelta
        from seeupo.llm.envs.bridge import decode_history, history_context

        if problem.num_instances != 1:
            raise ValueError("TableLM plays one instance: pass problem.instance(i)")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if problem.end_token is not None:
            raise ValueError("TableLM spells every answer of a turn with the same number of symbols: a problem with "
                             "an end_token (answers of different lengths) runs in the tabular engine only")
        L, alphabet = spelling.length, len(spelling.alphabet)
        for t, (vocab, length) in enumerate(problem.tokens):
            if length != L or (L > 1 and vocab != alphabet) or (L == 1 and vocab > alphabet):
                raise ValueError(
                    f"turn {t}: the tabular problem spells actions as {length} tokens of {vocab}, the bridge as {L} "
                    f"symbols of {alphabet}; TableLM needs the same digits (length {L}, and vocabulary {alphabet} "
                    "when L > 1, at most that when L == 1)")
        self.problem, self.spelling, self.temperature = problem, spelling, float(temperature)
        self.vocab_size = len(tokenizer)
        self.alphabet_ids = torch.tensor(spelling.token_ids, dtype=torch.long)
        self.tables = torch.nn.ParameterList()
        self._index: list[list[int]] = []  # [t][j] -> index in self.tables
        k = 0
        for t, (vocab, length) in enumerate(problem.tokens):
            self._index.append([])
            for j in range(length):
                expected = (1, problem.num_histories(t), vocab**j, vocab)
                if tuple(tables[k].shape) != expected:
                    raise ValueError(f"table {k} (turn {t}, token {j}) has shape {tuple(tables[k].shape)}, expected {expected}")
                self.tables.append(torch.nn.Parameter(tables[k].detach().clone()))
                self._index[t].append(k)
                k += 1
        self.states: list[tuple[int, int, int, int]] = []
        self._trie = _Trie()
        chat = ChatDelta(tokenizer)
        for t, (vocab, length) in enumerate(problem.tokens):
            for h in range(problem.num_histories(t)):
                s0, actions, observations = decode_history(problem, t, h)
                context = history_context(chat, problem, spelling, s0, actions, observations)
                for j in range(length):
                    for prefix in range(vocab**j):
                        digits = [(prefix // vocab ** (j - 1 - i)) % vocab for i in range(j)]
                        self._trie.add(context + [spelling.token_ids[d] for d in digits], len(self.states))
                        self.states.append((t, h, j, prefix))
        state = torch.tensor(self.states, dtype=torch.long).reshape(-1, 4)
        self.register_buffer("_state_table", state, persistent=False)
        self.config = SimpleNamespace(hidden_size=len(self.states) + 1, vocab_size=self.vocab_size)

    @classmethod
    def from_policy(cls, policy: Any, tokenizer: Any, problem: Any, spelling: Any, *,
                    temperature: float = 1.0) -> "TableLM":
        """A TableLM whose sampling distribution at ``temperature`` is ``policy``'s (a copy of its logits).

        ``policy`` is an independent :class:`~seeupo.tabular.policies.TabularPolicy` of the
        single-instance ``problem``; the model's tables are ``policy.logits`` (the logits it outputs
        are ``temperature`` times them).
        """
        if policy.parameterization != "independent":
            raise ValueError("TableLM needs an 'independent' TabularPolicy (one free logit per history and token)")
        return cls(problem, tokenizer, spelling, [p.detach() for p in policy.logits], temperature=temperature)

    @property
    def dtype(self) -> torch.dtype:
        return self.tables[0].dtype

    @property
    def base_model(self) -> TableBackbone:
        """A critic backbone reading the same states (see the module docstring)."""
        return TableBackbone(self._trie, len(self.states), self.dtype)

    def state_ids(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                  position_ids: Tensor | None = None) -> Tensor:
        """``[B, C]`` the index in :attr:`states` of the state after each position's prefix (-1: none)."""
        return _decode(self._trie, input_ids, attention_mask, position_ids)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                logits_to_keep: int = 0, use_cache: bool | None = None, **_: Any) -> TableLMOutput:
        state = self.state_ids(input_ids, attention_mask, position_ids)
        if logits_to_keep:
            state = state[:, -int(logits_to_keep):]
        B, K = state.shape
        logits = torch.zeros(B, K, self.vocab_size, dtype=self.dtype, device=input_ids.device)
        known = (state >= 0).nonzero()
        if known.numel() == 0:
            return TableLMOutput(logits)
        info = self._state_table[state[known[:, 0], known[:, 1]]]  # [m, 4]: t, h, j, prefix
        for t, (vocab, length) in enumerate(self.problem.tokens):
            for j in range(length):
                sel = ((info[:, 0] == t) & (info[:, 2] == j)).nonzero().squeeze(1)
                if sel.numel() == 0:  # this table is not read: it gets no gradient
                    continue
                values = self.tables[self._index[t][j]][0, info[sel, 1], info[sel, 3]] * self.temperature  # [m, V_t]
                block = torch.full((sel.numel(), self.vocab_size), -math.inf, dtype=self.dtype, device=logits.device)
                cols = self.alphabet_ids[:vocab].to(logits.device)
                block = block.index_put((torch.arange(sel.numel(), device=logits.device)[:, None], cols[None, :]), values)
                logits = logits.index_put((known[sel, 0], known[sel, 1]), block)
        return TableLMOutput(logits)


class TableEngine:
    """A :class:`seeupo.llm.rollout.RolloutEngine` sampling token by token from a causal LM's logits.

    Made for :class:`TableLM` (but any model with its call signature works): each new token is drawn
    from ``softmax(logits / temperature)`` of the model's *current* parameters (no copy, so
    :meth:`sync_weights` has nothing to do), restricted to the top-``p`` nucleus, with a
    ``torch.Generator`` seeded by ``params.seed`` (the global RNG when ``None``; untouched
    otherwise). Log-probabilities are computed in the model's dtype (float64 for an exact
    comparison), of the distribution each token was drawn from; ``temperature = 0`` decodes greedily
    and reports ``log_softmax(logits)``.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def sync_weights(self, model: torch.nn.Module) -> None:
        """No-op: the engine reads ``model``'s parameters at every step. Swaps in ``model`` if it is another one."""
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        stops = set(params.stop_token_ids)
        out = []
        for prompt in prompts:
            completions = []
            for _ in range(n):
                ids, new, logps, reason = list(prompt), [], [], "length"
                for _ in range(params.max_new_tokens):
                    x = torch.tensor([ids], dtype=torch.long)
                    logits = self.model(input_ids=x, attention_mask=torch.ones_like(x),
                                        position_ids=torch.arange(len(ids))[None, :], logits_to_keep=1).logits[0, -1]
                    tok, logp = _draw(logits, params, generator)
                    ids.append(tok), new.append(tok), logps.append(logp)
                    if tok in stops:
                        reason = "stop"
                        break
                completions.append(Completion(new, logps, reason))
            out.append(completions)
        return out


def _draw(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> tuple[int, float]:
    """One token and its log-probability under the distribution it is drawn from."""
    if params.temperature == 0:
        logp = torch.log_softmax(logits, -1)
        tok = int(logits.argmax())
        return tok, float(logp[tok])
    logp = torch.log_softmax(logits / params.temperature, -1)
    if params.top_p < 1.0:
        probs, order = logp.exp().sort(descending=True)
        keep = (probs.cumsum(0) - probs) < params.top_p  # the smallest prefix reaching top_p
        nucleus = torch.full_like(logp, -math.inf)
        nucleus[order[keep]] = logp[order[keep]]
        logp = torch.log_softmax(nucleus, -1)
    tok = int(torch.multinomial(logp.exp().cpu(), 1, generator=generator))
    return tok, float(logp[tok])
