"""A causal language model as a core :class:`~seeupo.core.update.Policy`, its frozen reference, and a critic.

Token layout of ``SampleBatch.data`` for language models (one row per (trajectory, turn))::

    input_ids       [n, C] long  context + response token ids, right-padded (pad value irrelevant)
    attention_mask  [n, C] long  1 on the row's real tokens (context and response), 0 on padding
    response_start  [n]    long  index in input_ids of the row's first response token

Response token ``j`` of row ``i`` is ``input_ids[i, response_start[i] + j]`` for
``j < token_mask[i].sum()``; the batch's ``token_mask`` / ``logp_old`` columns are response
positions. Its log-probability is read from the logits at position ``response_start[i] + j - 1``
(the prediction of the next token), so every valid row needs a non-empty context
(``response_start >= 1``). Placeholder rows (``valid=False``) are never run through the model:
their log-probabilities and values are exactly 0 and carry no gradient.

Padding safety: rows are right-padded and position ids are ``cumsum(attention_mask) - 1``, so a
real token only ever attends to the real tokens before it, at the positions it had when it was
sampled; a row's numbers do not depend on its padding or on the rows that share its micro-batch
(up to the floating-point summation order of batched matrix products; the tests bound it).

Temperature: the sampling policy at temperature ``tau`` is ``softmax(logits / tau)``.
:class:`CausalLMPolicy` scores under its ``temperature``, and the trainer must build it with the
rollout's sampling temperature: then ``logp_old`` (the engine's log-probabilities of the
sampled tokens) and the recomputed log-probabilities are of the same distribution, the
importance ratio is exactly 1 before the first update, and the KL reference is scored at the
same temperature (verl does the same). ``log_probs(batch, temperature=1.0)`` gives the raw
model's log-probabilities when wanted (e.g. for evaluation).

Modes: the policy never switches the model between ``train()`` and ``eval()``. Keep dropout off
(the Qwen3/Llama defaults have none) or recomputed log-probabilities are random and the ratio is
not 1 at the sampling weights.
"""

from __future__ import annotations

import copy
import inspect
from typing import Iterable, Iterator

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.parallel import DataParallel

Tensor = torch.Tensor


def pack_rows(
    contexts: list[list[int]], responses: list[list[int]], pad_token_id: int = 0
) -> dict[str, Tensor]:
    """The ``data`` dict of the module docstring's layout from per-row token lists.

    A row with an empty context and an empty response is a placeholder: all padding,
    ``response_start = 0``.
    """
    if len(contexts) != len(responses):
        raise ValueError("contexts and responses must have one entry per row")
    n = len(contexts)
    width = max((len(c) + len(r) for c, r in zip(contexts, responses)), default=0)
    input_ids = torch.full((n, max(width, 1)), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, max(width, 1)), dtype=torch.long)
    response_start = torch.zeros(n, dtype=torch.long)
    for i, (ctx, resp) in enumerate(zip(contexts, responses)):
        ids = list(ctx) + list(resp)
        if ids:
            input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, : len(ids)] = 1
        response_start[i] = len(ctx)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_start": response_start}


def scoring_batch(
    contexts: list[list[int]], responses: list[list[int]], pad_token_id: int = 0, dtype: torch.dtype = torch.float32
) -> SampleBatch:
    """A batch of independent rows to score (one trajectory each, turn 0, unit weight, no rewards).

    For teacher forcing outside the agent loop: every response given a context, e.g. every
    action of a finite action space (the bridge's exact ``J``) or supervised targets.
    """
    n = len(contexts)
    L = max((len(r) for r in responses), default=1)
    token_mask = torch.zeros(n, max(L, 1), dtype=torch.bool)
    for i, response in enumerate(responses):
        token_mask[i, : len(response)] = True
    return SampleBatch(
        traj_id=torch.arange(n), group_id=torch.arange(n), turn=torch.zeros(n, dtype=torch.long),
        logp_old=torch.zeros(token_mask.shape, dtype=dtype), token_mask=token_mask,
        valid=torch.tensor([len(r) > 0 for r in responses], dtype=torch.bool), reward=torch.zeros(n, dtype=dtype),
        traj_return=torch.zeros(n, dtype=dtype), weight=torch.ones(n, dtype=dtype), instance=torch.zeros(n, dtype=torch.long),
        data=pack_rows(contexts, responses, pad_token_id),
    )


def micro_batches(
    lengths: Tensor, rows: Tensor, micro_batch_size: int, max_tokens: int | None
) -> Iterator[Tensor]:
    """Split ``rows`` into micro-batches of at most ``micro_batch_size`` rows and ``max_tokens`` padded tokens.

    Rows are taken longest first so that rows of similar length share a micro-batch (less
    padding). A single row longer than ``max_tokens`` still forms its own micro-batch.
    """
    order = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
    start = 0
    while start < order.numel():
        width = int(lengths[order[start]])  # longest row of this micro-batch comes first
        count = micro_batch_size
        if max_tokens is not None:
            count = max(1, min(count, max_tokens // max(width, 1)))
        yield order[start : start + count]
        start += count


def _passes(
    lengths: Tensor, rows: Tensor, micro_batch_size: int, max_tokens: int | None, collective: DataParallel | None
) -> list[Tensor | None]:
    """The micro-batches of :func:`micro_batches`; with ``collective``, padded with ``None`` (a dummy
    pass) to the largest count over the processes, so that a sharded model's collectives match."""
    passes: list[Tensor | None] = list(micro_batches(lengths, rows, micro_batch_size, max_tokens))
    if collective is not None:
        passes += [None] * (int(collective.max(len(passes))) - len(passes))
    return passes


def _dummy_pass(model: torch.nn.Module, device: torch.device, head: torch.nn.Module | None = None) -> Tensor:
    """A one-token forward pass giving a scalar 0 that depends on every parameter the real passes use.

    Added to the output, it makes this process's backward pass reach the same modules as the
    other processes' (FSDP reduces gradients module by module) while adding exactly 0.
    """
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    out = _run_backbone(model, ids, torch.ones_like(ids))
    value = out.logits[0, 0, 0] if head is None else head(out.last_hidden_state[0, 0]).sum()
    return 0.0 * value


def _live_rows(batch: SampleBatch) -> Tensor:
    """Indices of the rows that go through the model: valid rows with at least one response token."""
    live = (batch.valid & batch.token_mask.any(1)).nonzero().squeeze(1)
    if bool((batch.data["response_start"][live] < 1).any()):
        raise ValueError("every valid row needs a non-empty context (response_start >= 1)")
    return live


def _response_positions(batch: SampleBatch, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For the given rows: ``(input slice width, positions [m, l] of the predicting logits, mask [m, l])``.

    ``l <= L`` is the longest response among the rows.
    """
    data = batch.data
    # only as many response columns as this micro-batch's longest response
    mask = batch.token_mask[rows, : int(batch.token_mask[rows].sum(1).max())]
    length = data["attention_mask"][rows].sum(1)
    j = torch.arange(mask.shape[1])
    # position of the logits that predict response token j; clamped on padding (masked anyway)
    pos = (data["response_start"][rows, None] + j[None, :] - 1).clamp(0, int(length.max()) - 1)
    return int(length.max()), pos, mask


def _run_backbone(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, **kwargs):
    """One forward pass with explicit position ids, so padding never shifts positions."""
    position_ids = (attention_mask.cumsum(1) - 1).clamp_min(0)
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs)


class CausalLMPolicy(torch.nn.Module):
    """Any Hugging Face ``AutoModelForCausalLM`` as a core ``Policy`` (see the module docstring).

    Args:
      model: the causal LM (its parameters are this policy's parameters).
      temperature: the sampling temperature ``tau``; :meth:`token_logps` scores under
        ``softmax(logits / tau)``.
      micro_batch_size: at most this many rows per forward pass.
      max_tokens_per_micro_batch: optional budget of padded tokens (rows x longest row) per pass.
      collective: for a model sharded over data-parallel processes (FSDP): every call makes as
        many forward passes as the process that needs the most (the others run a dummy pass
        that adds 0), even on an empty batch, so that the model's collectives match.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        temperature: float = 1.0,
        micro_batch_size: int = 8,
        max_tokens_per_micro_batch: int | None = None,
        collective: DataParallel | None = None,
    ) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 to score log-probabilities, got {temperature}")
        self.model = model
        self.temperature = float(temperature)
        self.micro_batch_size = int(micro_batch_size)
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.collective = collective
        # transformers' causal LMs can compute logits for the last k positions only
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters

    def token_logps(self, batch: SampleBatch) -> Tensor:
        """``[n, L]`` log-probabilities of each row's response tokens under ``softmax(logits / temperature)``.

        Differentiable with respect to the model's parameters; 0 on padding and on placeholder rows.
        The result is on the batch's device, in the model's dtype promoted to at least float32;
        token ids go to the model's device per micro-batch.
        """
        return self.log_probs(batch, self.temperature)

    def log_probs(self, batch: SampleBatch, temperature: float | None = None) -> Tensor:
        """:meth:`token_logps` at another temperature (``None``: the policy's own)."""
        tau = self.temperature if temperature is None else float(temperature)
        data = batch.data
        n, L = batch.token_mask.shape
        param = next(self.model.parameters())
        # softmax in at least float32: bf16/fp16 log-probabilities are too coarse for ratios
        dtype = torch.promote_types(param.dtype, torch.float32)
        out = torch.zeros(n, L, dtype=dtype, device=batch.token_mask.device)
        live = _live_rows(batch)
        lengths = data["attention_mask"].sum(1)
        for rows in _passes(lengths, live, self.micro_batch_size, self.max_tokens_per_micro_batch, self.collective):
            if rows is None:
                out = out + _dummy_pass(self.model, param.device).to(out.device, out.dtype)
                continue
            width, pos, mask = _response_positions(batch, rows)
            ids = data["input_ids"][rows, :width].to(param.device)
            attention_mask = data["attention_mask"][rows, :width].to(param.device)
            pos, mask = pos.to(param.device), mask.to(param.device)
            # only the positions from the earliest response on need logits: with long contexts and
            # large vocabularies the full [m, C, V] logits would dominate memory
            first = int(pos.min())
            if self._keeps_logits:
                logits = _run_backbone(self.model, ids, attention_mask, logits_to_keep=width - first).logits
            else:
                logits = _run_backbone(self.model, ids, attention_mask).logits[:, first:]
            picked = logits.gather(1, (pos - first)[:, :, None].expand(-1, -1, logits.shape[-1]))  # [m, L, V]
            logp = torch.log_softmax(picked.to(dtype) / tau, dim=-1)
            target = ids.gather(1, (pos + 1).clamp(max=width - 1))  # response token j sits at pos + 1
            tok_logp = logp.gather(2, target[:, :, None]).squeeze(2)
            cols = torch.arange(mask.shape[1], device=out.device)
            out = out.index_put((rows[:, None], cols[None, :]), torch.where(mask, tok_logp, 0.0).to(out.device))
        return out


class ReferencePolicy:
    """A frozen copy of a causal LM giving ``logp_ref`` for the KL term (no gradient, eval mode).

    It scores at the same temperature as the trained policy, so that ``KL(pi || pi_ref)`` compares
    the two sampling distributions.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        temperature: float = 1.0,
        micro_batch_size: int = 8,
        max_tokens_per_micro_batch: int | None = None,
        copy_model: bool = True,
        collective: DataParallel | None = None,
    ) -> None:
        frozen = copy.deepcopy(model) if copy_model else model
        frozen.eval()
        frozen.requires_grad_(False)
        self._policy = CausalLMPolicy(
            frozen,
            temperature=temperature,
            micro_batch_size=micro_batch_size,
            max_tokens_per_micro_batch=max_tokens_per_micro_batch,
            collective=collective,
        )

    @property
    def model(self) -> torch.nn.Module:
        return self._policy.model

    @torch.no_grad()
    def logp_ref(self, batch: SampleBatch) -> Tensor:
        """``[n, L]`` reference log-probabilities of the batch's response tokens (0 on padding/placeholders)."""
        return self._policy.token_logps(batch)


class ValueModel(torch.nn.Module):
    """A critic: a language-model backbone and a linear scalar head, one value per response token.

    ``values(batch)[i, j]`` is ``V`` of the state *before* response token ``j`` of row ``i``,
    i.e. of the prefix ``context + response[:j]``: the head reads the backbone's last hidden
    state at position ``response_start + j - 1`` (the same position whose logits predict token
    ``j``). This is the ``critic_values [n, L]`` that :func:`seeupo.core.advantages.gae_for_batch`
    expects (column 0 is ``V(h_t)`` for turn-level GAE).

    Args:
      backbone: a transformer returning ``last_hidden_state`` (e.g. ``causal_lm.base_model``).
      hidden_size: its hidden size.
    """

    def __init__(
        self,
        backbone: torch.nn.Module,
        hidden_size: int,
        *,
        micro_batch_size: int = 8,
        max_tokens_per_micro_batch: int | None = None,
        collective: DataParallel | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        dtype = next(backbone.parameters()).dtype
        self.head = torch.nn.Linear(hidden_size, 1, dtype=dtype)
        # start from V = 0 everywhere: the first advantages are the raw returns, not noise
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.micro_batch_size = int(micro_batch_size)
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.collective = collective

    @classmethod
    def from_causal_lm(cls, lm: torch.nn.Module, *, copy_model: bool = True, **kwargs) -> "ValueModel":
        """A critic initialised from a causal LM's backbone (a deep copy unless ``copy_model=False``)."""
        source = copy.deepcopy(lm) if copy_model else lm
        return cls(source.base_model, source.config.hidden_size, **kwargs)

    def values(self, batch: SampleBatch) -> Tensor:
        """``[n, L]`` values (differentiable); 0 on padding and on placeholder rows."""
        return self(batch)  # through __call__, so that module hooks (FSDP's unsharding) run

    def forward(self, batch: SampleBatch) -> Tensor:
        data = batch.data
        n, L = batch.token_mask.shape
        out = torch.zeros(n, L, dtype=self.head.weight.dtype, device=batch.token_mask.device)
        live = _live_rows(batch)
        lengths = data["attention_mask"].sum(1)
        device = self.head.weight.device
        for rows in _passes(lengths, live, self.micro_batch_size, self.max_tokens_per_micro_batch, self.collective):
            if rows is None:
                out = out + _dummy_pass(self.backbone, device, self.head).to(out.device, out.dtype)
                continue
            width, pos, mask = _response_positions(batch, rows)
            hidden = _run_backbone(
                self.backbone, data["input_ids"][rows, :width].to(device), data["attention_mask"][rows, :width].to(device)
            ).last_hidden_state
            picked = hidden.gather(1, pos.to(device)[:, :, None].expand(-1, -1, hidden.shape[-1]))
            value = self.head(picked).squeeze(-1).to(out.device)
            cols = torch.arange(mask.shape[1], device=out.device)
            out = out.index_put((rows[:, None], cols[None, :]), torch.where(mask, value, 0.0))
        return out


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps: float | None = 0.2,
    num_tokens: float | None = None,
) -> Tensor:
    """The PPO value loss with value clipping, a token mean over ``mask`` (to minimise).

    ``0.5 * mean_mask max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)`` with ``R`` the
    return targets (for GAE: ``advantages + old_values``) and ``V_old`` the critic's values at
    rollout time. The clip keeps the critic near its rollout-time values, like the policy's ratio
    clip; ``clip_eps=None`` gives the plain squared error ``0.5 * mean_mask (V - R)^2``. An empty
    mask gives 0. ``num_tokens`` replaces ``mask.sum()`` as the divisor (data parallelism: the
    count over every process, so that the processes' losses add up to the global mean).
    """
    err = (values - returns) ** 2
    if clip_eps is not None:
        clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        err = torch.maximum(err, (clipped - returns) ** 2)
    mask = mask.to(err.dtype)
    total = mask.sum().clamp_min(1.0) if num_tokens is None else max(float(num_tokens), 1.0)
    return 0.5 * (err * mask).sum() / total


def trainable_parameters(module: torch.nn.Module) -> Iterable[Tensor]:
    """The parameters that require gradients (what an optimizer of a policy or critic should get)."""
    return (p for p in module.parameters() if p.requires_grad)
