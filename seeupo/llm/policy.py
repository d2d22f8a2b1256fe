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

Packed scoring (``scoring="packed"``, the default): the agent loop appends and never re-encodes,
so turn ``k``'s row (context + response) is a token prefix of turn ``k+1``'s row of the same
trajectory. With causal attention the logits (hidden states) at a prefix's positions do not depend
on the tokens after it, so only each trajectory's longest row (its *carrier*) is forwarded and every
row it carries reads its response log-probabilities (values) from the carrier's output at
``response_start + j - 1``: the same numbers and gradients as forwarding the row itself, up to the
floating-point summation order of the longer pass (the tests bound it). A row is carried only
when its real tokens equal the carrier's first tokens (checked on the ids, :func:`packing_plan`);
any other row is forwarded itself. Packing is within the rows of one call (with data
parallelism: within one process's own rows). ``scoring="per_row"`` forwards every row: the
reference layout.

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
from dataclasses import dataclass
from typing import Iterable, Iterator, get_args

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.parallel import DataParallel
from seeupo.llm.config import Scoring

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


def packing_plan(traj_id: Tensor, input_ids: Tensor, lengths: Tensor) -> Tensor:
    """``carrier [m]``: for each of ``m`` rows, the row whose forward pass gives its numbers.

    Rows are visited longest first within each trajectory (``traj_id``); a row whose first
    ``lengths[i]`` token ids equal the first ``lengths[i]`` ids of an earlier-visited carrier
    of its trajectory (the longest such carrier) is carried by it, any other row is a carrier
    (``carrier[i] == i``). Rows of different trajectories are never packed together, and a row
    is carried only when the ids say it is a prefix: nothing is assumed of the batch.

    Args:
      traj_id: ``[m]`` trajectory of each row.
      input_ids: ``[m, C]`` token ids, right-padded.
      lengths: ``[m]`` real tokens of each row (its attention mask's sum).
    """
    traj_id, input_ids, lengths = traj_id.cpu(), input_ids.cpu(), lengths.cpu()
    m = traj_id.numel()
    carrier = torch.arange(m)
    # by trajectory, then longest first (ties: the earlier row carries the later)
    by_length = torch.argsort(lengths, descending=True, stable=True)
    order = by_length[torch.argsort(traj_id[by_length], stable=True)]
    traj = traj_id.tolist()
    carriers: list[int] = []  # the current trajectory's carriers, longest first
    for k, i in enumerate(order.tolist()):
        if k == 0 or traj[i] != traj[int(order[k - 1])]:
            carriers = []
        n = int(lengths[i])
        match = next((c for c in carriers if torch.equal(input_ids[c, :n], input_ids[i, :n])), None)
        if match is None:
            carriers.append(i)
        else:
            carrier[i] = match
    return carrier


@dataclass(frozen=True)
class _Pass:
    """One forward pass: the rows it forwards and the rows whose numbers it gives.

    ``rows[k]`` reads its numbers from the forwarded row ``forwarded[slot[k]]``.
    """

    forwarded: Tensor
    rows: Tensor
    slot: Tensor


def _scoring_passes(
    batch: SampleBatch,
    scoring: Scoring,
    micro_batch_size: int,
    max_tokens: int | None,
    collective: DataParallel | None,
) -> list[_Pass | None]:
    """The forward passes that score ``batch``'s live rows (``None``: a dummy pass, see :func:`_passes`).

    ``"per_row"`` forwards every live row; ``"packed"`` forwards the carriers of
    :func:`packing_plan` only. The forwarded rows are micro-batched by their own lengths, so the
    token budget counts the tokens actually forwarded.
    """
    if scoring not in get_args(Scoring):
        raise ValueError(f"unknown scoring {scoring!r}; expected one of {get_args(Scoring)}")
    data = batch.data
    live = _live_rows(batch).cpu()
    lengths = data["attention_mask"].sum(1).cpu()
    carrier = live
    if scoring == "packed":
        carrier = live[packing_plan(batch.traj_id[live], data["input_ids"][live], lengths[live])]
    slot_of = torch.full((batch.num_rows,), -1, dtype=torch.long)
    passes: list[_Pass | None] = []
    for forwarded in _passes(lengths, torch.unique(carrier), micro_batch_size, max_tokens, collective):
        if forwarded is None:
            passes.append(None)
            continue
        slot_of[forwarded] = torch.arange(forwarded.numel())
        served = slot_of[carrier] >= 0
        passes.append(_Pass(forwarded, live[served], slot_of[carrier[served]]))
        slot_of[forwarded] = -1
    return passes


def _response_positions(batch: SampleBatch, rows: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """For the given rows: ``(positions [m, l] of the predicting logits, mask [m, l])``.

    ``l <= L`` is the longest response among the rows; positions are clamped to ``[0, width)``
    on padding (masked anyway).
    """
    # only as many response columns as these rows' longest response
    mask = batch.token_mask[rows, : int(batch.token_mask[rows].sum(1).max())]
    j = torch.arange(mask.shape[1])
    # position of the logits that predict response token j
    pos = (batch.data["response_start"][rows, None].cpu() + j[None, :] - 1).clamp(0, width - 1)
    return pos, mask


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
      scoring: ``"packed"`` forwards each trajectory's longest row once for all the rows that are
        its prefixes; ``"per_row"`` forwards every row (see the module docstring). The row and
        token limits count the rows and tokens forwarded.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        temperature: float = 1.0,
        micro_batch_size: int = 8,
        max_tokens_per_micro_batch: int | None = None,
        collective: DataParallel | None = None,
        scoring: Scoring = "packed",
    ) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 to score log-probabilities, got {temperature}")
        self.model = model
        self.temperature = float(temperature)
        self.micro_batch_size = int(micro_batch_size)
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.collective = collective
        self.scoring = scoring
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
        n, L = batch.token_mask.shape
        param = next(self.model.parameters())
        # softmax in at least float32: bf16/fp16 log-probabilities are too coarse for ratios
        dtype = torch.promote_types(param.dtype, torch.float32)
        out = torch.zeros(n, L, dtype=dtype, device=batch.token_mask.device)
        passes = _scoring_passes(batch, self.scoring, self.micro_batch_size, self.max_tokens_per_micro_batch, self.collective)
        for p in passes:
            if p is None:
                out = out + _dummy_pass(self.model, param.device).to(out.device, out.dtype)
                continue
            ids, attention_mask, width = _forwarded_tokens(batch, p.forwarded, param.device)
            pos, mask = _response_positions(batch, p.rows, width)
            pos, mask, slot = pos.to(param.device), mask.to(param.device), p.slot.to(param.device)
            # only the positions from the earliest response on need logits: with long contexts and
            # large vocabularies the full [m, C, V] logits would dominate memory
            first = int(pos.min())
            if self._keeps_logits:
                logits = _run_backbone(self.model, ids, attention_mask, logits_to_keep=width - first).logits
            else:
                logits = _run_backbone(self.model, ids, attention_mask).logits[:, first:]
            picked = logits[slot[:, None], pos - first]  # [k, l, V]: row k's positions in its forwarded row
            logp = torch.log_softmax(picked.to(dtype) / tau, dim=-1)
            target = ids[slot[:, None], (pos + 1).clamp(max=width - 1)]  # response token j sits at pos + 1
            tok_logp = logp.gather(2, target[:, :, None]).squeeze(2)
            out = _write_rows(out, p.rows, torch.where(mask, tok_logp, 0.0))
        return out


def _forwarded_tokens(batch: SampleBatch, forwarded: Tensor, device: torch.device) -> tuple[Tensor, Tensor, int]:
    """``(input_ids, attention_mask, width)`` of the forwarded rows, cut to the longest, on ``device``."""
    data = batch.data
    width = int(data["attention_mask"][forwarded].sum(1).max())
    return data["input_ids"][forwarded, :width].to(device), data["attention_mask"][forwarded, :width].to(device), width


def _write_rows(out: Tensor, rows: Tensor, values: Tensor) -> Tensor:
    """``out`` with ``values [k, l]`` written in its rows ``rows`` and first ``l`` columns (differentiable)."""
    cols = torch.arange(values.shape[1], device=out.device)
    return out.index_put((rows.to(out.device)[:, None], cols[None, :]), values.to(out.device, out.dtype))


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
        scoring: Scoring = "packed",
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
            scoring=scoring,
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
      micro_batch_size, max_tokens_per_micro_batch, collective, scoring: as for :class:`CausalLMPolicy`.
    """

    def __init__(
        self,
        backbone: torch.nn.Module,
        hidden_size: int,
        *,
        micro_batch_size: int = 8,
        max_tokens_per_micro_batch: int | None = None,
        collective: DataParallel | None = None,
        scoring: Scoring = "packed",
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
        self.scoring = scoring

    @classmethod
    def from_causal_lm(cls, lm: torch.nn.Module, *, copy_model: bool = True, **kwargs) -> "ValueModel":
        """A critic initialised from a causal LM's backbone (a deep copy unless ``copy_model=False``)."""
        source = copy.deepcopy(lm) if copy_model else lm
        return cls(source.base_model, source.config.hidden_size, **kwargs)

    def values(self, batch: SampleBatch) -> Tensor:
        """``[n, L]`` values (differentiable); 0 on padding and on placeholder rows."""
        return self(batch)  # through __call__, so that module hooks (FSDP's unsharding) run

    def forward(self, batch: SampleBatch) -> Tensor:
        n, L = batch.token_mask.shape
        out = torch.zeros(n, L, dtype=self.head.weight.dtype, device=batch.token_mask.device)
        device = self.head.weight.device
        passes = _scoring_passes(batch, self.scoring, self.micro_batch_size, self.max_tokens_per_micro_batch, self.collective)
        for p in passes:
            if p is None:
                out = out + _dummy_pass(self.backbone, device, self.head).to(out.device, out.dtype)
                continue
            ids, attention_mask, width = _forwarded_tokens(batch, p.forwarded, device)
            pos, mask = _response_positions(batch, p.rows, width)
            hidden = _run_backbone(self.backbone, ids, attention_mask).last_hidden_state
            picked = hidden[p.slot.to(device)[:, None], pos.to(device)]  # [k, l, H]
            value = self.head(picked).squeeze(-1)
            out = _write_rows(out, p.rows, torch.where(mask.to(device), value, 0.0))
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
