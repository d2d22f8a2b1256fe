"""The forward passes that score a batch: which rows each pass forwards, its model call, and what it reads.

:class:`~seeupo.llm.policy.CausalLMPolicy`, :class:`~seeupo.llm.policy.ReferencePolicy` and
:class:`~seeupo.llm.policy.ValueModel` score through these passes (the layouts, packing, shared
prefixes and tree attention are described in :mod:`seeupo.llm.policy`): :func:`_plan` splits the
live rows into passes under a scoring, row and token limits (:func:`micro_batches`,
:func:`shared_micro_batches`), :func:`_pass_inputs` builds each pass's model call (right-padded
rows, or one packed row under tree attention) and what it reads, :func:`_write_rows` writes the
read values into the ``[n, L]`` result.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, get_args

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.parallel import DataParallel
from seeupo.llm.config import Scoring
from seeupo.llm.layout import packing_plan, shared_prefix_lengths
from seeupo.llm.memory import AS_NEEDED, DEVICE_SHARE, auto_token_budget, is_checkpointed, recomputing
from seeupo.llm.tree_attention import TreeKernel, default_kernel, enable_tree_attention, pack_tree, prepared_mask
from seeupo.validation.errors import InputError

if TYPE_CHECKING:  # the scorers that plan passes; they import this module
    from seeupo.llm.policy import CausalLMPolicy, ValueModel

Tensor = torch.Tensor


def micro_batches(
    lengths: Tensor, rows: Tensor, micro_batch_rows: int | None, max_tokens: int | None, padded: bool = True
) -> Iterator[Tensor]:
    """Split ``rows`` into micro-batches of at most ``micro_batch_rows`` rows and ``max_tokens`` tokens.

    Rows are taken longest first so that rows of similar length share a micro-batch (less
    padding). ``padded``: a micro-batch costs its rows x its longest row (right-padded rows);
    otherwise the sum of its rows' lengths (rows packed into one row, :mod:`seeupo.llm.tree_attention`).
    A single row longer than ``max_tokens`` still forms its own micro-batch. ``None`` lifts a limit.
    """
    order = rows[torch.argsort(lengths[rows], descending=True, stable=True)].tolist()
    current: list[int] = []
    width = total = 0
    for i in order:
        n = int(lengths[i])
        cost = (len(current) + 1) * max(width, n) if padded else total + n
        too_many = micro_batch_rows is not None and len(current) >= micro_batch_rows
        if current and (too_many or (max_tokens is not None and cost > max_tokens)):
            yield torch.tensor(current, dtype=torch.long)
            current, width, total = [], 0, 0
        current.append(i)
        width, total = max(width, n), total + n
    if current:
        yield torch.tensor(current, dtype=torch.long)


def shared_micro_batches(
    group: Tensor, prefix: Tensor, lengths: Tensor, rows: Tensor, micro_batch_rows: int | None, max_tokens: int | None
) -> Iterator[Tensor]:
    """Split ``rows`` into prefix-shared passes (:func:`~seeupo.llm.tree_attention.pack_tree`).

    Rows are taken group by group (``group``), longest first within a group, so that a group's
    rows share a pass and its prefix is forwarded once. A pass holds at most ``micro_batch_rows``
    rows and ``max_tokens`` tokens forwarded: each of its groups' ``prefix`` once plus each row's
    remainder ``lengths - prefix`` (one packed row, no padding). A single row over ``max_tokens``
    still forms its own pass; ``None`` lifts a limit.
    """
    by_length = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
    order = by_length[torch.argsort(group[by_length], stable=True)].tolist()
    current: list[int] = []
    groups: set[int] = set()
    total = 0
    for i in order:
        g, p, s = int(group[i]), int(prefix[i]), int(lengths[i] - prefix[i])
        cost = total + s + (p if g not in groups else 0)
        too_many = micro_batch_rows is not None and len(current) >= micro_batch_rows
        if current and (too_many or (max_tokens is not None and cost > max_tokens)):
            yield torch.tensor(current, dtype=torch.long)
            current, groups, total = [], set(), 0
            cost = p + s
        current.append(i)
        groups.add(g)
        total = cost
    if current:
        yield torch.tensor(current, dtype=torch.long)


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
    (tree attention, :mod:`seeupo.llm.tree_attention`) the forwarded rows are packed into one row:
    the first ``prefix[i]`` tokens of ``forwarded[i]`` are shared by the rows of its group
    ``prefix_row[i]`` and forwarded once (``"packed"``: no prefix, each row its own group).
    """

    forwarded: Tensor
    rows: Tensor
    slot: Tensor
    prefix: Tensor | None = None
    prefix_row: Tensor | None = None


def effective_scoring(model: torch.nn.Module, scoring: Scoring) -> Scoring:
    """``scoring``, or ``"packed"`` where ``"prefix_shared"`` cannot run on ``model`` (warned once per
    caller and reason, by :mod:`warnings`' default filter)."""
    if scoring not in get_args(Scoring):
        raise ValueError(f"unknown scoring {scoring!r}; expected one of {get_args(Scoring)}")
    if scoring != "prefix_shared":
        return scoring
    reason = enable_tree_attention(model)
    if reason is None:
        return scoring
    warnings.warn(f"scoring='prefix_shared' falls back to 'packed' for {type(model).__name__}: {reason}", stacklevel=3)
    return "packed"


def tree_kernel(model: torch.nn.Module, scoring: Scoring) -> TreeKernel | None:
    """The tree-attention kernel of ``model``'s passes under ``scoring`` (one :func:`effective_scoring`
    returned), or ``None`` for padded passes (``"per_row"``, or a model tree attention cannot run on)."""
    if scoring == "per_row" or enable_tree_attention(model) is not None:
        return None
    return default_kernel(next(model.parameters()).device)


def _scoring_passes(
    batch: SampleBatch,
    scoring: Scoring,
    micro_batch_rows: int | None,
    max_tokens: int | None,
    collective: DataParallel | None,
    tree: bool = False,
    strict_budget: bool = False,
) -> list[_Pass | None]:
    """The forward passes that score ``batch``'s live rows (``None``: a dummy pass).

    ``"per_row"`` forwards every live row; ``"packed"`` forwards the carriers of
    :func:`packing_plan` only; ``"prefix_shared"`` forwards the carriers with each group's shared
    prefix once per pass (:func:`shared_prefix_lengths`, up to the first position any row it
    serves reads). The forwarded rows are micro-batched by the tokens they forward
    (:func:`micro_batches`, :func:`shared_micro_batches`): packed into one row under tree
    attention (``tree``, which ``"prefix_shared"`` needs), else right-padded. With ``collective``,
    the passes are padded with dummy passes to the largest count over the processes, so that a
    sharded model's collectives match. ``strict_budget`` (a budget chosen from the device's
    memory): a row longer than ``max_tokens`` is an error before any pass runs, not a pass that
    runs out of memory. ``scoring`` is one :func:`effective_scoring` returned.
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
        plan = micro_batches(lengths, forwarded_rows, micro_batch_rows, max_tokens, padded=not tree)
    if strict_budget and max_tokens is not None and forwarded_rows.numel():
        longest = int(lengths[forwarded_rows].max())
        if longest > max_tokens:
            raise InputError(
                "optim.micro_batch_tokens",
                f"unset, so chosen from this device's memory: {max_tokens} tokens per pass, but a row of {longest} "
                "tokens cannot fit one pass; turn on activation checkpointing, use a larger GPU, or shorten the "
                "contexts (rollout.max_context)")
    slot_of = torch.full((batch.num_rows,), -1, dtype=torch.long)
    passes: list[_Pass | None] = []
    for forwarded in plan:
        slot_of[forwarded] = torch.arange(forwarded.numel())
        served = slot_of[carrier] >= 0
        shared = {}
        if prefix is not None:
            shared = {"prefix": prefix[forwarded], "prefix_row": torch.unique(group[forwarded], return_inverse=True)[1]}
        elif tree:  # packed rows, no shared prefix: each row its own group
            shared = {"prefix": torch.zeros(forwarded.numel(), dtype=torch.long), "prefix_row": torch.arange(forwarded.numel())}
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


def _recomputing(model: torch.nn.Module, calls: list[tuple[Any, dict[str, Any], Any]], budget: "_AutoBudget"):
    """:func:`seeupo.llm.memory.recomputing` for the model calls of one scoring (their activations
    are all alive at the backward pass that follows): sized by all their tokens, padding included,
    against the memory budget (:func:`seeupo.llm.memory.auto_token_budget`) whether or not
    ``micro_batch_tokens`` sets a smaller one."""
    if not torch.is_grad_enabled() or not getattr(model, AS_NEEDED, False):
        return contextlib.nullcontext()
    tokens = sum(int(inputs["input_ids"].numel()) for _, inputs, _ in calls)
    return recomputing(model, tokens, budget.get(model, True))


def _plan(
    owner: CausalLMPolicy | ValueModel, model: torch.nn.Module, batch: SampleBatch, max_rows: int | None,
    max_tokens: int | None, collective: DataParallel | None,
) -> tuple[list[_Pass | None], TreeKernel | None]:
    """The passes that score ``batch`` with ``owner``'s ``model`` under its scoring and these limits, and
    their tree kernel. No ``max_tokens``: ``owner``'s budget from the device's memory, if any."""
    scoring, kernel = _plan_kernel(model, owner.scoring)
    strict = max_tokens is None and owner.auto_budget() is not None
    if max_tokens is None:
        max_tokens = owner.auto_budget()
    return _scoring_passes(batch, scoring, max_rows, max_tokens, collective, tree=kernel is not None,
                           strict_budget=strict), kernel


class _AutoBudget:
    """A model's token budget per pass from its device's memory (:func:`seeupo.llm.memory.auto_token_budget`),
    computed at its first pass and kept, so that every step plans its passes alike."""

    def __init__(self, share: float = DEVICE_SHARE) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"memory_share must be in (0, 1], got {share}")
        self.share = share
        self._value: int | None = None
        self._known = False

    def get(self, model: torch.nn.Module, trainable: bool) -> int | None:
        if not self._known:
            self._value = auto_token_budget(model, is_checkpointed(model), trainable, self.share)
            self._known = True
        return self._value


def _plan_kernel(model: torch.nn.Module, scoring: Scoring) -> tuple[Scoring, TreeKernel | None]:
    """``(the scoring that runs on model, its tree kernel)`` (:func:`effective_scoring`, :func:`tree_kernel`)."""
    scoring = effective_scoring(model, scoring)
    return scoring, tree_kernel(model, scoring)


@dataclass(frozen=True)
class _Reads:
    """What a pass reads from its output: ``pick(output [B, W, X]) -> [k, l, X]`` the positions that
    predict the response tokens ``target [k, l]`` of the pass's rows, ``mask [k, l]`` the real ones."""

    pick: Callable[[Tensor], Tensor]
    target: Tensor
    mask: Tensor


def _pass_inputs(
    batch: SampleBatch, p: _Pass | None, device: torch.device, kernel: TreeKernel | None, keeps_logits: bool = False,
) -> tuple[dict[str, Any], _Reads]:
    """The model call of pass ``p`` (its keyword arguments) and what it reads, on ``device``.

    ``kernel``: the forwarded rows are packed into one row under tree attention (``p.prefix``
    set); ``None``: right-padded rows. ``p=None``: a dummy pass of one token, through the same
    kind of call (every process of a sharded model makes the same calls; its result times 0
    reaches every parameter the real passes use while adding exactly 0). ``keeps_logits`` (a
    model scored from its own logits that takes ``logits_to_keep``, right-padded rows): its logits
    are computed from the first read position on only (a model whose parameters serve single
    positions, TableLM, then gives no gradient, not a zero one, to the positions before).
    """
    if p is None:
        ids, lengths = torch.zeros(1, 1, dtype=torch.long, device=device), torch.ones(1, dtype=torch.long)
        pos = mask = torch.zeros(1, 1, dtype=torch.long, device=device)
        slot, target = pos, pos
        zeros = torch.zeros(1, dtype=torch.long)
        prefix = prefix_row = zeros
    else:
        data = batch.data
        lengths = data["attention_mask"][p.forwarded].sum(1).cpu()
        width = int(lengths.max())
        ids = data["input_ids"][p.forwarded, :width].to(device)
        pos, mask = _response_positions(batch, p.rows, width)
        slot, pos, mask = p.slot.to(device)[:, None], pos.to(device), mask.to(device)
        target = ids[slot, (pos + 1).clamp(max=width - 1)]  # response token j sits at pos + 1
        prefix, prefix_row = p.prefix, p.prefix_row
    if kernel is None:
        attention_mask = (torch.arange(ids.shape[1]) < lengths[:, None]).long().to(device)
        inputs = dict(input_ids=ids, attention_mask=attention_mask,
                      position_ids=(attention_mask.cumsum(1) - 1).clamp_min(0), use_cache=False)
        first = int(pos.min()) if keeps_logits else 0
        if keeps_logits:
            inputs["logits_to_keep"] = ids.shape[1] - first
        return inputs, _Reads(lambda out: out[slot, pos - first], target, mask)
    packed = pack_tree(ids, lengths, prefix, prefix_row, kernel)
    inputs = dict(input_ids=packed.input_ids, position_ids=packed.position_ids,
                  attention_mask=prepared_mask(packed.mask), use_cache=False)
    # padding columns (masked) may read any position: the row's first token
    index = packed.index[slot, pos].clamp_min(0)
    return inputs, _Reads(lambda out: out[0, index], target, mask)


def _write_rows(out: Tensor, rows: Tensor, values: Tensor) -> Tensor:
    """``out`` with ``values [k, l]`` written in its rows ``rows`` and first ``l`` columns (differentiable)."""
    cols = torch.arange(values.shape[1], device=out.device)
    return out.index_put((rows.to(out.device)[:, None], cols[None, :]), values.to(out.device, out.dtype))
