"""Tabular softmax policies over token-spelled actions, batched over instances.

The turn-``t`` action is ``L_t`` tokens ``y_0 .. y_{L-1}`` from a vocabulary of ``V_t``;
the policy is autoregressive over tokens, ``pi(a | h) = prod_j pi(y_j | h, y_<j)``, with one
softmax per (history, token prefix). For atomic actions (``L = 1``) this is the usual
table of logits per history.

Parameterisations:

* ``"independent"``: a free logit per (instance, history, prefix, token) — the tabular,
  disjoint-parameter setting of the paper's theory.
* ``"shared"``: ``logit = phi(t, h, prefix, token) . w`` with fixed random features of
  dimension ``feature_dim`` shared by every turn and history, so an update at one history
  moves the policy at others — a small model of an LLM's parameter sharing.
"""

from __future__ import annotations

from typing import Literal

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.losses import entropy_of_log_probs
from seeupo.tabular.problems import DTYPE, TreeMDP, token_digits

Tensor = torch.Tensor
LOG_ZERO = -1e30  # log(0) that stays finite under subtraction


class TabularPolicy(torch.nn.Module):
    """A softmax policy for every turn of a :class:`TreeMDP` batch (see the module docstring)."""

    def __init__(
        self,
        problem: TreeMDP,
        parameterization: Literal["independent", "shared"] = "independent",
        *,
        feature_dim: int = 4,
        init_scale: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if parameterization not in ("independent", "shared"):
            raise ValueError(f"unknown parameterization {parameterization!r}; expected 'independent' or 'shared'")
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        self.parameterization = parameterization
        self.tokens = problem.tokens
        self.num_instances = problem.num_instances
        self.max_tokens = problem.max_tokens
        self.answer_lengths = [problem.answer_lengths(t) for t in range(problem.num_turns)]
        self.possible_actions = [problem.possible_actions(t) for t in range(problem.num_turns)]
        shapes = [
            [(problem.num_histories(t), vocab**j, vocab) for j in range(length)]
            for t, (vocab, length) in enumerate(problem.tokens)
        ]
        self.logits = torch.nn.ParameterList()
        if parameterization == "independent":
            for turn_shapes in shapes:
                for shape in turn_shapes:
                    init = init_scale * torch.randn((self.num_instances, *shape), generator=gen, dtype=DTYPE)
                    self.logits.append(torch.nn.Parameter(init))
        else:
            self.weights = torch.nn.Parameter(
                init_scale * torch.randn(self.num_instances, feature_dim, generator=gen, dtype=DTYPE)
            )
            for k, shape in enumerate(s for turn_shapes in shapes for s in turn_shapes):
                feats = torch.randn((*shape, feature_dim), generator=gen, dtype=DTYPE) / feature_dim**0.5
                self.register_buffer(f"features_{k}", feats)
        self._shapes = shapes

    @property
    def turns_share_parameters(self) -> bool:
        """Whether every parameter serves every turn (``"shared"``): then a sequential update takes the
        fused ratio passes a language model takes (:class:`seeupo.core.execution.Policy`)."""
        return self.parameterization == "shared"

    def _table(self, t: int, j: int) -> Tensor:
        """Logits ``[I, N_t, V^j, V]`` of token ``j`` at turn ``t``."""
        k = sum(len(s) for s in self._shapes[:t]) + j
        if self.parameterization == "independent":
            return self.logits[k]
        return torch.einsum("npvd,id->inpv", getattr(self, f"features_{k}"), self.weights)

    def token_log_probs(self) -> list[list[Tensor]]:
        """Per turn, per token position ``j``: ``[I, N_t, V^j, V]``, ``log pi(y_j | h, y_<j)`` for every prefix."""
        return [[torch.log_softmax(self._table(t, j), dim=-1) for j in range(length)]
                for t, (_, length) in enumerate(self.tokens)]

    @torch.no_grad()
    def set_token_log_probs(self, tables: list[list[Tensor]]) -> None:
        """Set an independent policy's token conditionals to ``tables`` (as :meth:`token_log_probs` gives them;
        ``-inf`` for a token it never samples)."""
        if self.parameterization != "independent":
            raise ValueError("set_token_log_probs needs the 'independent' parameterization")
        for t, turn_tables in enumerate(tables):
            k0 = sum(len(s) for s in self._shapes[:t])
            for j, table in enumerate(turn_tables):
                self.logits[k0 + j].copy_(table.clamp_min(LOG_ZERO))

    def action_token_log_probs(self) -> list[Tensor]:
        """Per turn ``[I, N_t, A_t, L_t]``: ``log pi(y_j | h, y_<j)`` of each token of every action at every history
        (0 after an answer's end)."""
        out = []
        for t, (vocab, length) in enumerate(self.tokens):
            prefix, token = token_digits(torch.arange(vocab**length), vocab, length)
            spelled = torch.arange(length)[None, :] < self.answer_lengths[t][:, None]  # [A, L]
            columns = []
            for j in range(length):
                logp = torch.log_softmax(self._table(t, j), dim=-1)  # [I, N, V^j, V]
                columns.append(torch.where(spelled[:, j], logp[:, :, prefix[:, j], token[:, j]], 0.0))
            out.append(torch.stack(columns, -1))
        return out

    def action_log_probs(self) -> list[Tensor]:
        """Per turn ``[I, N_t, A_t]``: ``log pi(a | h)`` for every history and action (:data:`LOG_ZERO` for an
        impossible one: a nonzero token after the end token)."""
        return [torch.where(possible, tokens.sum(-1), LOG_ZERO)
                for tokens, possible in zip(self.action_token_log_probs(), self.possible_actions)]

    def action_probs(self) -> list[Tensor]:
        """Per turn ``[I, N_t, A_t]``: ``pi(a | h)``."""
        return [lp.exp() for lp in self.action_log_probs()]

    def _by_turn(self, batch: SampleBatch):
        """Per turn with valid rows: ``(t, length, rows, inst, hist, prefix, token, spelled)``, the rows' indices and
        the digits of their actions. Placeholders are left out: a turn whose rows are all placeholders gets no
        gradient (None, not zero), as in a language model, so that Adam's momentum leaves it alone."""
        hist, action = batch.data["hist"], batch.data["action"]
        for t, (vocab, length) in enumerate(self.tokens):
            rows = ((batch.turn == t) & batch.valid).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            prefix, token = token_digits(action[rows], vocab, length)
            spelled = torch.arange(length)[None, :] < self.answer_lengths[t][action[rows]][:, None]
            yield t, length, rows, batch.instance[rows], hist[rows], prefix, token, spelled

    def token_logps(self, batch: SampleBatch) -> Tensor:
        """``[n, L_max]`` per-token log-probabilities of the batch's actions (0 on padding, and after an answer's end)."""
        out = torch.zeros(batch.num_rows, self.max_tokens, dtype=DTYPE)
        for t, length, rows, inst, h, prefix, token, spelled in self._by_turn(batch):
            cols = [torch.log_softmax(self._table(t, j), dim=-1)[inst, h, prefix[:, j], token[:, j]] for j in range(length)]
            out = out.index_put((rows[:, None], torch.arange(length)[None, :]), torch.stack(cols, 1) * spelled)
        return out

    def token_entropies(self, batch: SampleBatch) -> Tensor:
        """``[n, L_max]`` the entropy of each of the batch's tokens' conditional distributions,
        ``-sum_y pi(y | h, y_<j) log pi(y | h, y_<j)`` (0 on padding and after an answer's end); differentiable."""
        out = torch.zeros(batch.num_rows, self.max_tokens, dtype=DTYPE)
        for t, length, rows, inst, h, prefix, _, spelled in self._by_turn(batch):
            cols = []
            for j in range(length):
                cols.append(entropy_of_log_probs(torch.log_softmax(self._table(t, j), dim=-1)[inst, h, prefix[:, j]]))
            out = out.index_put((rows[:, None], torch.arange(length)[None, :]), torch.stack(cols, 1) * spelled)
        return out

    @torch.no_grad()
    def set_action_probs(self, probs: list[Tensor]) -> None:
        """Set an independent policy to the given ``pi(a | h)`` per turn (``[I, N_t, A_t]``).

        Token logits are the log conditional probabilities ``log P(y_<=j) - log P(y_<j)``
        of the action distribution's prefix marginals; a zero-probability prefix gets a
        uniform conditional.
        """
        if self.parameterization != "independent":
            raise ValueError("set_action_probs needs the 'independent' parameterization")
        for t, (vocab, length) in enumerate(self.tokens):
            p = probs[t].to(DTYPE)
            k0 = sum(len(s) for s in self._shapes[:t])
            for j in range(length):
                # marginal of the first j+1 tokens: [I, N, V^(j+1)] -> [I, N, V^j, V]
                marg = p.reshape(*p.shape[:2], vocab ** (j + 1), -1).sum(-1).reshape(*p.shape[:2], vocab**j, vocab)
                cond = marg / marg.sum(-1, keepdim=True).clamp_min(1e-300)
                cond = torch.where(marg.sum(-1, keepdim=True) > 0, cond, torch.full_like(cond, 1.0 / vocab))
                self.logits[k0 + j].copy_(torch.log(cond.clamp_min(1e-300)).clamp_min(LOG_ZERO))


def uniform_probs(problem: TreeMDP) -> list[Tensor]:
    """The uniform policy over the possible actions, per turn ``[I, N_t, A_t]``."""
    out = []
    for t in range(problem.num_turns):
        possible = problem.possible_actions(t).to(DTYPE)
        out.append((possible / possible.sum()).expand(problem.num_instances, problem.num_histories(t), -1).clone())
    return out
