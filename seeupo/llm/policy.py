"""A causal language model as a core :class:`~seeupo.core.update.Policy`, its frozen reference, and a critic.

The token layout of ``SampleBatch.data`` (one row per (trajectory, turn)) is :mod:`seeupo.llm.layout`'s.

Padding safety: rows are right-padded and position ids are ``cumsum(attention_mask) - 1``, so a
real token only ever attends to the real tokens before it, at the positions it had when it was
sampled; a row's numbers do not depend on its padding or on the rows that share its micro-batch
(up to the floating-point summation order of batched matrix products; the tests bound it).

Packed scoring (``scoring="packed"``): the agent loop appends and never re-encodes,
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

Prefix-shared scoring (``scoring="prefix_shared"``, the default): packed, and the rollouts of one
task (``group_id``) start from the same prompt, so each pass forwards the prefix its carriers share
(checked on the ids, :func:`~seeupo.llm.layout.shared_prefix_lengths`, up to the first position
any of them reads) once, and every carrier's remaining tokens attending to it
(:mod:`seeupo.llm.shared_prefix`: two model calls per pass, the prefix's keys and values kept in
the autograd graph). The same numbers and gradients again, up to summation order.

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
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, get_args

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.parallel import DataParallel
from seeupo.llm.config import Scoring
from seeupo.llm.layout import packing_plan, shared_prefix_lengths
from seeupo.llm.shared_prefix import forward_shared, prefix_sharing_unsupported

Tensor = torch.Tensor


def micro_batches(
    lengths: Tensor, rows: Tensor, micro_batch_rows: int | None, max_tokens: int | None
) -> Iterator[Tensor]:
    """Split ``rows`` into micro-batches of at most ``micro_batch_rows`` rows and ``max_tokens`` padded tokens.

    Rows are taken longest first so that rows of similar length share a micro-batch (less
    padding). A single row longer than ``max_tokens`` still forms its own micro-batch. ``None``
    lifts a limit.
    """
    order = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
    start = 0
    while start < order.numel():
        width = int(lengths[order[start]])  # longest row of this micro-batch comes first
        count = micro_batch_rows if micro_batch_rows is not None else order.numel()
        if max_tokens is not None:
            count = max(1, min(count, max_tokens // max(width, 1)))
        yield order[start : start + count]
        start += count


def shared_micro_batches(
    group: Tensor, prefix: Tensor, lengths: Tensor, rows: Tensor, micro_batch_rows: int | None, max_tokens: int | None
) -> Iterator[Tensor]:
    """Split ``rows`` into passes of :func:`~seeupo.llm.shared_prefix.forward_shared`.

    Rows are taken group by group (``group``), longest first within a group, so that a group's
    rows share a pass and its prefix is forwarded once. A pass holds at most ``micro_batch_rows``
    rows and ``max_tokens`` padded tokens forwarded: its groups x their longest ``prefix`` (the
    prefix call) plus its rows x their longest remainder ``lengths - prefix`` (the suffix call).
    A single row over ``max_tokens`` still forms its own pass; ``None`` lifts a limit.
    """
    by_length = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
    order = by_length[torch.argsort(group[by_length], stable=True)].tolist()
    current: list[int] = []
    groups: set[int] = set()
    longest_prefix = longest_suffix = 0
    for i in order:
        g, p, s = int(group[i]), int(prefix[i]), int(lengths[i] - prefix[i])
        cost = (len(groups | {g}) * max(longest_prefix, p, 1) + (len(current) + 1) * max(longest_suffix, s))
        too_many = micro_batch_rows is not None and len(current) >= micro_batch_rows
        if current and (too_many or (max_tokens is not None and cost > max_tokens)):
            yield torch.tensor(current, dtype=torch.long)
            current, groups, longest_prefix, longest_suffix = [], set(), 0, 0
        current.append(i)
        groups.add(g)
        longest_prefix, longest_suffix = max(longest_prefix, p), max(longest_suffix, s)
    if current:
        yield torch.tensor(current, dtype=torch.long)


def _dummy_pass(
    model: torch.nn.Module, device: torch.device, head: torch.nn.Module | None = None, shared: bool = False
) -> Tensor:
    """A forward pass of one token (``shared``: a one-token prefix and a one-token suffix, the same two
    calls as a real pass) giving a scalar 0 that depends on every parameter the real passes use.

    Added to the output, it makes this process's backward pass reach the same modules as the
    other processes' (FSDP reduces gradients module by module) while adding exactly 0.
    """
    if shared:
        ids = torch.zeros(1, 2, dtype=torch.long, device=device)
        one = torch.ones(1, dtype=torch.long)
        out, _ = forward_shared(model, ids, 2 * one, one, 0 * one)
    else:
        ids = torch.zeros(1, 1, dtype=torch.long, device=device)
        out = _run_backbone(model, ids, torch.ones_like(ids))
    value = out.logits[0, 0, 0] if head is None else head(out.last_hidden_state[0, 0]).sum()
    return 0.0 * value


def _live_rows(batch: SampleBatch) -> Tensor:
    """Indices of the rows that go through the model: valid rows with at least one response token.

    Refuses (``ValueError``) a live row without a context or whose ``attention_mask`` is not right-padded.
    """
    live = (batch.valid & batch.token_mask.any(1)).nonzero().squeeze(1)
    if bool((batch.data["response_start"][live] < 1).any()):
        raise ValueError("every valid row needs a non-empty context (response_start >= 1)")
    # every layout reads a row's tokens from column 0 (response_start, widths, position ids): a 0
    # before a 1 (left padding, or a hole) would be scored wrong without an error
    mask = batch.data["attention_mask"][live]
    unpadded = (mask[:, 1:] > mask[:, :-1]).any(1)  # a 0 followed by a 1
    if bool(unpadded.any()):
        k = int(unpadded.nonzero()[0])
        i, what = int(live[k]), "starts with 0" if not mask[k, 0] else "has a 0 between 1s"
        raise ValueError(f"rows must be right-padded (real tokens first, then padding): row {i}'s attention_mask {what}")
    return live


@dataclass(frozen=True)
class _Pass:
    """One forward pass: the rows it forwards and the rows whose numbers it gives.

    ``rows[k]`` reads its numbers from the forwarded row ``forwarded[slot[k]]``. With ``prefix``
    (``scoring="prefix_shared"``) the pass makes two calls (:func:`forward_shared`): the first
    ``prefix[i]`` tokens of ``forwarded[i]`` are computed once per group (``prefix_row[i]``), the
    rest by the second call.
    """

    forwarded: Tensor
    rows: Tensor
    slot: Tensor
    prefix: Tensor | None = None
    prefix_row: Tensor | None = None


_WARNED: set[tuple[int, str]] = set()  # (model, reason) pairs already warned of


def effective_scoring(model: torch.nn.Module, scoring: Scoring) -> Scoring:
    """``scoring``, or ``"packed"`` where ``"prefix_shared"`` cannot run on ``model`` (warned once)."""
    if scoring not in get_args(Scoring):
        raise ValueError(f"unknown scoring {scoring!r}; expected one of {get_args(Scoring)}")
    if scoring != "prefix_shared":
        return scoring
    reason = prefix_sharing_unsupported(model)
    if reason is None:
        return scoring
    if (id(model), reason) not in _WARNED:
        _WARNED.add((id(model), reason))
        warnings.warn(f"scoring='prefix_shared' falls back to 'packed' for {type(model).__name__}: {reason}", stacklevel=3)
    return "packed"


def _scoring_passes(
    batch: SampleBatch,
    scoring: Scoring,
    micro_batch_rows: int | None,
    max_tokens: int | None,
    collective: DataParallel | None,
) -> list[_Pass | None]:
    """The forward passes that score ``batch``'s live rows (``None``: a dummy pass).

    ``"per_row"`` forwards every live row; ``"packed"`` forwards the carriers of
    :func:`packing_plan` only; ``"prefix_shared"`` forwards the carriers with each group's shared
    prefix once per pass (:func:`shared_prefix_lengths`, up to the first position any row it
    serves reads). The forwarded rows are micro-batched by the tokens they forward
    (:func:`micro_batches`, :func:`shared_micro_batches`). With ``collective``, the passes are
    padded with dummy passes to the largest count over the processes, so that a sharded model's
    collectives match. ``scoring`` is one :func:`effective_scoring` returned.
    """
    data = batch.data
    live = _live_rows(batch).cpu()
    lengths = data["attention_mask"].sum(1).cpu()
    carrier = live
    if scoring != "per_row":
        carrier = live[packing_plan(batch.traj_id[live], data["input_ids"][live], lengths[live])]
    forwarded_rows = torch.unique(carrier)
    prefix = group = None
    if scoring == "prefix_shared":
        group = batch.group_id.cpu()
        # the first logit any served row reads: the prefix must end before it
        first_read = torch.full((batch.num_rows,), data["input_ids"].shape[1], dtype=torch.long)
        first_read.scatter_reduce_(0, carrier, data["response_start"][live].cpu() - 1, "amin")
        prefix = torch.zeros(batch.num_rows, dtype=torch.long)
        prefix[forwarded_rows] = shared_prefix_lengths(
            group[forwarded_rows], data["input_ids"][forwarded_rows], lengths[forwarded_rows], first_read[forwarded_rows])
        plan = shared_micro_batches(group, prefix, lengths, forwarded_rows, micro_batch_rows, max_tokens)
    else:
        plan = micro_batches(lengths, forwarded_rows, micro_batch_rows, max_tokens)
    slot_of = torch.full((batch.num_rows,), -1, dtype=torch.long)
    passes: list[_Pass | None] = []
    for forwarded in plan:
        slot_of[forwarded] = torch.arange(forwarded.numel())
        served = slot_of[carrier] >= 0
        shared = {}
        if prefix is not None:
            shared = {"prefix": prefix[forwarded], "prefix_row": torch.unique(group[forwarded], return_inverse=True)[1]}
        passes.append(_Pass(forwarded, live[served], slot_of[carrier[served]], **shared))
        slot_of[forwarded] = -1
    if collective is not None:
        passes += [None] * (int(collective.max(len(passes))) - len(passes))
    return passes


def _merged_by_trajectory(parts: list[Tensor], traj_id: Tensor) -> list[Tensor]:
    """``parts`` (row indices) with every two parts that hold rows of one trajectory merged, in order."""
    parent = list(range(len(parts)))

    def root(k: int) -> int:
        while parent[k] != k:
            k = parent[k]
        return k

    first: dict[int, int] = {}  # trajectory -> the first part that holds it
    for k, part in enumerate(parts):
        for t in traj_id[part].tolist():
            if t in first:
                parent[root(k)] = root(first[t])
            else:
                first[t] = k
    merged: dict[int, list[Tensor]] = {}
    for k, part in enumerate(parts):
        merged.setdefault(root(k), []).append(part)
    return [torch.cat(group) for group in merged.values()]


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
      micro_batch_rows: at most this many rows forwarded per pass (``None``: no limit).
      micro_batch_tokens: optional budget of padded tokens forwarded per pass (rows x longest row;
        with ``"prefix_shared"`` the prefix call's tokens too).
      collective: for a model sharded over data-parallel processes (FSDP): every call makes as
        many forward passes as the process that needs the most (the others run a dummy pass
        that adds 0), even on an empty batch, so that the model's collectives match.
      scoring: ``"prefix_shared"`` forwards each group's shared prompt once per pass and each
        trajectory's longest row once for all the rows that are its prefixes; ``"packed"`` the
        latter only; ``"per_row"`` every row (see the module docstring). The row and token limits
        count the rows and tokens forwarded.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        temperature: float = 1.0,
        micro_batch_rows: int | None = 8,
        micro_batch_tokens: int | None = None,
        collective: DataParallel | None = None,
        scoring: Scoring = "prefix_shared",
    ) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 to score log-probabilities, got {temperature}")
        self.model = model
        self.temperature = float(temperature)
        self.micro_batch_rows = micro_batch_rows
        self.micro_batch_tokens = micro_batch_tokens
        self.collective = collective
        self.scoring = scoring
        # every weight of a language model serves every turn (seeupo.core.update.Policy); a model
        # with per-turn parameters (TableLM) says otherwise
        self.turns_share_parameters = bool(getattr(model, "turns_share_parameters", True))
        # transformers' causal LMs can compute logits for the last k positions only
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters

    def micro_batches(
        self, batch: SampleBatch, max_rows: int | None, max_tokens: int | None, whole_trajectories: bool
    ) -> list[Tensor]:
        """The update's forward/backward passes of ``batch`` (row indices; the core's ``Policy`` hook).

        The rows served by each of the passes :meth:`token_logps` would make with these limits
        (the same planning: ``max_rows`` forwarded rows and ``max_tokens`` padded tokens forwarded,
        the prefix call's included), so an update's token budget counts the tokens the layout
        actually forwards, and each micro-batch is then one pass. With ``whole_trajectories``,
        passes that share a trajectory are merged. Rows no pass forwards (placeholders) join the
        micro-batch of their trajectory.
        """
        scoring = effective_scoring(self.model, self.scoring)
        parts = [p.rows for p in _scoring_passes(batch, scoring, max_rows, max_tokens, None)]
        if whole_trajectories:
            parts = _merged_by_trajectory(parts, batch.traj_id.cpu())
        # the rows no pass forwards join the micro-batch of their trajectory (else the first)
        part_of_traj = torch.zeros(batch.num_trajectories, dtype=torch.long)
        served = torch.zeros(batch.num_rows, dtype=torch.bool)
        for k, part in reversed(list(enumerate(parts))):
            part_of_traj[batch.traj_id[part].cpu()] = k
            served[part] = True
        rest = (~served).nonzero().squeeze(1)
        if not parts:
            return [rest.to(batch.traj_id.device)]
        home = part_of_traj[batch.traj_id[rest].cpu()]
        parts = [torch.cat([part, rest[home == k]]) for k, part in enumerate(parts)]
        return [part.to(batch.traj_id.device) for part in parts]

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
        scoring = effective_scoring(self.model, self.scoring)
        passes = _scoring_passes(batch, scoring, self.micro_batch_rows, self.micro_batch_tokens, self.collective)
        for p in passes:
            if p is None:
                dummy = _dummy_pass(self.model, param.device, shared=scoring == "prefix_shared")
                out = out + dummy.to(out.device, out.dtype)
                continue
            output, ids, pos, read, mask = _forward(self.model, batch, p, param.device, self._keeps_logits)
            slot = p.slot.to(param.device)
            picked = output.logits[slot[:, None], read]  # [k, l, V]: row k's positions in its forwarded row's output
            logp = torch.log_softmax(picked.to(dtype) / tau, dim=-1)
            target = ids[slot[:, None], (pos + 1).clamp(max=ids.shape[1] - 1)]  # response token j sits at pos + 1
            tok_logp = logp.gather(2, target[:, :, None]).squeeze(2)
            out = _write_rows(out, p.rows, torch.where(mask, tok_logp, 0.0))
        return out


def _forward(
    model: torch.nn.Module, batch: SampleBatch, p: _Pass, device: torch.device, keeps_logits: bool = False
) -> tuple[Any, Tensor, Tensor, Tensor, Tensor]:
    """Run pass ``p``: ``(output, input_ids, pos, read, mask)``.

    ``output`` is the model's output over the computed positions, ``input_ids [f, W]`` the
    forwarded rows' ids; ``pos [k, l]`` the position in its forwarded row of the logits (hidden
    state) that predict response token ``j`` of row ``p.rows[k]``, ``read [k, l]`` the same
    position in ``output``, with ``mask [k, l]`` (:func:`_response_positions`); all on ``device``.
    With ``keeps_logits`` (a causal LM that takes ``logits_to_keep``) the LM head runs only from
    the first read position on: with long contexts and large vocabularies the full ``[f, W, V]``
    logits would dominate memory.
    """
    data = batch.data
    lengths = data["attention_mask"][p.forwarded].sum(1).cpu()
    width = int(lengths.max())
    ids = data["input_ids"][p.forwarded, :width].to(device)
    pos, mask = _response_positions(batch, p.rows, width)
    offset = p.prefix[p.slot] if p.prefix is not None else torch.zeros_like(p.slot)
    computed = width if p.prefix is None else int((lengths - p.prefix).max())
    read = (pos - offset[:, None]).clamp(0, computed - 1)  # padding columns may point anywhere (masked)
    first = int(read.min()) if keeps_logits else 0
    kwargs = {"logits_to_keep": computed - first} if keeps_logits else {}
    if p.prefix is None:
        output = _run_backbone(model, ids, data["attention_mask"][p.forwarded, :width].to(device), **kwargs)
    else:
        prefix_kwargs = {"logits_to_keep": 1} if keeps_logits else {}
        output, _ = forward_shared(model, ids, lengths, p.prefix, p.prefix_row, prefix_kwargs, **kwargs)
    return output, ids, pos.to(device), (read - first).to(device), mask.to(device)


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
        micro_batch_rows: int | None = 8,
        micro_batch_tokens: int | None = None,
        copy_model: bool = True,
        collective: DataParallel | None = None,
        scoring: Scoring = "prefix_shared",
    ) -> None:
        frozen = copy.deepcopy(model) if copy_model else model
        frozen.eval()
        frozen.requires_grad_(False)
        self._policy = CausalLMPolicy(
            frozen,
            temperature=temperature,
            micro_batch_rows=micro_batch_rows,
            micro_batch_tokens=micro_batch_tokens,
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
      micro_batch_rows, micro_batch_tokens, collective, scoring: as for :class:`CausalLMPolicy`.
    """

    def __init__(
        self,
        backbone: torch.nn.Module,
        hidden_size: int,
        *,
        micro_batch_rows: int | None = 8,
        micro_batch_tokens: int | None = None,
        collective: DataParallel | None = None,
        scoring: Scoring = "prefix_shared",
    ) -> None:
        super().__init__()
        self.backbone = backbone
        dtype = next(backbone.parameters()).dtype
        self.head = torch.nn.Linear(hidden_size, 1, dtype=dtype)
        # start from V = 0 everywhere: the first advantages are the raw returns, not noise
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.micro_batch_rows = micro_batch_rows
        self.micro_batch_tokens = micro_batch_tokens
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
        scoring = effective_scoring(self.backbone, self.scoring)
        passes = _scoring_passes(batch, scoring, self.micro_batch_rows, self.micro_batch_tokens, self.collective)
        for p in passes:
            if p is None:
                dummy = _dummy_pass(self.backbone, device, self.head, shared=scoring == "prefix_shared")
                out = out + dummy.to(out.device, out.dtype)
                continue
            output, _, _, read, mask = _forward(self.backbone, batch, p, device)
            picked = output.last_hidden_state[p.slot.to(device)[:, None], read]  # [k, l, H]
            value = self.head(picked).squeeze(-1)
            out = _write_rows(out, p.rows, torch.where(mask, value, 0.0))
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
