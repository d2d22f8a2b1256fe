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
any of them reads) once, and every carrier's remaining tokens attending to it. The same numbers
and gradients again, up to summation order.

Tree attention (:mod:`seeupo.llm.tree_attention`): under ``"packed"`` and ``"prefix_shared"`` a
pass's forwarded rows are laid out as one packed row without padding (each group's prefix once,
then each carrier's rest), forwarded by one model call whose attention lets a token see its own
row's earlier tokens only (flex attention on CUDA, the cascade kernel elsewhere). A model
it cannot run on (no transformers attention interface, sliding-window layers) forwards right-padded
rows under ``"packed"``, and ``"prefix_shared"`` falls back to that with a warning.

LM head: for a causal LM whose logits are its head applied to its backbone's last hidden state
(:func:`plain_head`), the head runs on the read positions only (the response tokens), not on
every position of the pass.

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

import contextlib
import copy
import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, get_args

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.parallel import DataParallel
from seeupo.llm.config import Scoring
from seeupo.llm.layout import packing_plan, shared_prefix_lengths
from seeupo.llm.logprobs import LogprobPath, TokenLogprobs, head_unsupported, logprob_backend
from seeupo.llm.memory import AS_NEEDED, DEVICE_SHARE, auto_token_budget, is_checkpointed, recomputing
from seeupo.llm.tree_attention import TreeKernel, default_kernel, enable_tree_attention, pack_tree, prepared_mask
from seeupo.validation.errors import InputError

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


def plain_head(model: torch.nn.Module) -> tuple[str, torch.nn.Linear] | None:
    """``(attribute, head)`` of a causal LM whose logits are exactly ``model.<attribute>(final hidden state)``,
    or ``None`` (:func:`~seeupo.llm.logprobs.head_unsupported` says why: the model soft-caps or scales
    its logits after the head, or is not a known transformers causal LM); such a model is scored
    from its own logits."""
    if head_unsupported(model) is not None:
        return None
    head = model.get_output_embeddings()
    names = [name for name, child in model.named_children() if child is head]
    return (names[0], head) if len(names) == 1 else None


class CausalLMPolicy(torch.nn.Module):
    """Any Hugging Face ``AutoModelForCausalLM`` as a core ``Policy`` (see the module docstring).

    Args:
      model: the causal LM (its parameters are this policy's parameters).
      temperature: the sampling temperature ``tau``; :meth:`token_logps` scores under
        ``softmax(logits / tau)``.
      micro_batch_rows: at most this many rows forwarded per pass (``None``: no limit).
      micro_batch_tokens: at most this many tokens forwarded per pass (packed rows count their
        real tokens, right-padded rows rows x the longest). ``None``: on a GPU, a budget chosen
        from the model's shape and the device's memory at the first pass
        (:mod:`seeupo.llm.memory`; a row over it is an error before any pass), on the CPU no limit.
      memory_share: the share of the GPU's memory that budget plans for, in (0, 1]
        (``parallel.memory_share``; with activation checkpointing ``"as_needed"`` it bounds the peak).
      collective: for a model sharded over data-parallel processes (FSDP): every call makes as
        many forward passes as the process that needs the most (the others run a dummy pass
        that adds 0), even on an empty batch, so that the model's collectives match.
      scoring: ``"prefix_shared"`` forwards each group's shared prompt once per pass and each
        trajectory's longest row once for all the rows that are its prefixes; ``"packed"`` the
        latter only; ``"per_row"`` every row (see the module docstring). The row and token limits
        count the rows and tokens forwarded.
      logprobs: how the LM head's log-probabilities are computed (:mod:`seeupo.llm.logprobs`):
        ``"auto"`` liger-kernel's fused kernel on CUDA where installed, else ``"chunked"`` (chunks of
        rows, recomputed in the backward pass: no ``[positions x vocabulary]`` tensor is kept);
        ``"reference"`` the plain ``log_softmax`` over the logits. A model whose logits are not its
        head's output (:func:`plain_head`) is scored from its own logits whatever this says.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        temperature: float = 1.0,
        micro_batch_rows: int | None = 8,
        micro_batch_tokens: int | None = None,
        memory_share: float = DEVICE_SHARE,
        collective: DataParallel | None = None,
        scoring: Scoring = "prefix_shared",
        logprobs: LogprobPath = "auto",
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
        if logprobs not in get_args(LogprobPath):
            raise ValueError(f"unknown logprobs {logprobs!r}; expected one of {get_args(LogprobPath)}")
        self.logprobs = logprobs
        # every weight of a language model serves every turn (seeupo.core.update.Policy); a model
        # with per-turn parameters (TableLM) says otherwise
        self.turns_share_parameters = bool(getattr(model, "turns_share_parameters", True))
        # the LM head runs on the read positions only, not on every position of every row
        self._head = plain_head(model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        _plan_kernel(model, scoring)  # tree attention is set up (and probed) once, here
        self._budget = _AutoBudget(memory_share)

    def auto_budget(self) -> int | None:
        """Tokens per pass chosen from the GPU's memory when ``micro_batch_tokens`` is ``None`` (CPU: ``None``)."""
        if self.micro_batch_tokens is not None:
            return None
        return self._budget.get(self.model, any(p.requires_grad for p in self.model.parameters()))

    def micro_batches(
        self, batch: SampleBatch, max_rows: int | None, max_tokens: int | None, whole_trajectories: bool
    ) -> list[Tensor]:
        """The update's forward/backward passes of ``batch`` (row indices; the core's ``Policy`` hook).

        The rows served by each of the passes :meth:`token_logps` would make with these limits
        (the same planning: ``max_rows`` forwarded rows and ``max_tokens`` tokens forwarded), so an update's token budget counts the tokens the layout
        actually forwards, and each micro-batch is then one pass. With ``whole_trajectories``,
        passes that share a trajectory are merged. Rows no pass forwards (placeholders) join the
        micro-batch of their trajectory.
        """
        passes, _ = _plan(self, self.model, batch, max_rows, max_tokens, None)
        parts = [p.rows for p in passes]
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
        passes, kernel = _plan(self, self.model, batch, self.micro_batch_rows, self.micro_batch_tokens, self.collective)
        calls = [(p, *_pass_inputs(batch, p, param.device, kernel, self._head is None and self._keeps_logits))
                 for p in passes]
        with _recomputing(self.model, calls, self._budget):
            while calls:  # each pass's inputs (its tree mask's block mask too) are dropped once it ran
                p, inputs, reads = calls.pop(0)
                if self._head is not None:  # the head gives the log-probabilities of the read tokens only
                    with _head_gives_logprobs(self.model, self._head, reads, tau, logprob_backend(self.logprobs, param.device)):
                        tok_logp = self.model(**inputs).logits
                else:  # the model's own logits (every position of the pass), then the read ones
                    tok_logp = _logprobs_of_logits(reads.pick(self.model(**inputs).logits), reads.target, tau)
                if p is None:  # a dummy pass: an exact 0 that reaches every parameter
                    out = out + 0.0 * tok_logp.sum().to(out.device, out.dtype)
                    continue
                out = _write_rows(out, p.rows, torch.where(reads.mask, tok_logp, 0.0))
        return out


def _recomputing(model: torch.nn.Module, calls: list[tuple[Any, dict[str, Any], Any]], budget: "_AutoBudget"):
    """:func:`seeupo.llm.memory.recomputing` for the model calls of one scoring (their activations
    are all alive at the backward pass that follows): sized by all their tokens, padding included,
    against the memory budget (:func:`seeupo.llm.memory.auto_token_budget`) whether or not
    ``micro_batch_tokens`` sets a smaller one."""
    if not torch.is_grad_enabled() or not getattr(model, AS_NEEDED, False):
        return contextlib.nullcontext()
    tokens = sum(int(inputs["input_ids"].numel()) for _, inputs, _ in calls)
    return recomputing(model, tokens, budget.get(model, True))


def _logprobs_of_logits(logits: Tensor, target: Tensor, temperature: float) -> Tensor:
    """``log softmax(logits / temperature)[target]`` in at least float32 (bf16/fp16 log-probabilities are too
    coarse for ratios): ``[...]`` from ``logits [..., V]`` and ``target [...]``."""
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, dim=-1)
    return logp.gather(-1, target[..., None]).squeeze(-1)


class _LogprobHead(torch.nn.Module):
    """Stands in for a causal LM's head for one call: the log-probabilities of the read tokens, not logits."""

    def __init__(self, head: torch.nn.Linear, reads: "_Reads", temperature: float, logprobs: TokenLogprobs) -> None:
        super().__init__()
        self.head, self.reads, self.temperature, self.logprobs = head, reads, temperature, logprobs

    def forward(self, hidden: Tensor) -> Tensor:
        picked = self.reads.pick(hidden)  # [k, l, H]
        flat = self.logprobs(picked.reshape(-1, picked.shape[-1]), self.head.weight, self.reads.target.reshape(-1),
                             self.temperature, bias=self.head.bias)
        return flat.reshape(self.reads.target.shape)


@contextlib.contextmanager
def _head_gives_logprobs(
    model: torch.nn.Module, head: tuple[str, torch.nn.Linear], reads: "_Reads", temperature: float,
    logprobs: TokenLogprobs,
) -> Iterator[None]:
    """Within the block, ``model(...).logits`` are the ``[k, l]`` log-probabilities of ``reads``' tokens.

    The head's computation happens inside the model's own call (not on its output), so that a
    sharded model (FSDP) has its head's weights gathered then, as for its own head.
    """
    name, linear = head
    setattr(model, name, _LogprobHead(linear, reads, temperature, logprobs))
    try:
        yield
    finally:
        setattr(model, name, linear)


def _plan(
    owner: "CausalLMPolicy | ValueModel", model: torch.nn.Module, batch: SampleBatch, max_rows: int | None,
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
        memory_share: float = DEVICE_SHARE,
        copy_model: bool = True,
        collective: DataParallel | None = None,
        scoring: Scoring = "prefix_shared",
        logprobs: LogprobPath = "auto",
    ) -> None:
        frozen = copy.deepcopy(model) if copy_model else model
        frozen.eval()
        frozen.requires_grad_(False)
        self._policy = CausalLMPolicy(
            frozen,
            temperature=temperature,
            micro_batch_rows=micro_batch_rows,
            micro_batch_tokens=micro_batch_tokens,
            memory_share=memory_share,
            collective=collective,
            scoring=scoring,
            logprobs=logprobs,
        )

    @property
    def model(self) -> torch.nn.Module:
        return self._policy.model

    def auto_budget(self) -> int | None:
        """Tokens per pass chosen from the GPU's memory (:meth:`CausalLMPolicy.auto_budget`; a frozen model's)."""
        return self._policy.auto_budget()

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
      micro_batch_rows, micro_batch_tokens, memory_share, collective, scoring: as for :class:`CausalLMPolicy`.
    """

    def __init__(
        self,
        backbone: torch.nn.Module,
        hidden_size: int,
        *,
        micro_batch_rows: int | None = 8,
        micro_batch_tokens: int | None = None,
        memory_share: float = DEVICE_SHARE,
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
        _plan_kernel(backbone, scoring)  # tree attention is set up (and probed) once, here
        self._budget = _AutoBudget(memory_share)

    def auto_budget(self) -> int | None:
        """Tokens per pass chosen from the GPU's memory when ``micro_batch_tokens`` is ``None`` (CPU: ``None``)."""
        if self.micro_batch_tokens is not None:
            return None
        return self._budget.get(self.backbone, True)

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
        passes, kernel = _plan(self, self.backbone, batch, self.micro_batch_rows, self.micro_batch_tokens,
                               self.collective)
        calls = [(p, *_pass_inputs(batch, p, device, kernel)) for p in passes]
        with _recomputing(self.backbone, calls, self._budget):
            while calls:
                p, inputs, reads = calls.pop(0)
                value = self.head(reads.pick(self.backbone(**inputs).last_hidden_state)).squeeze(-1)  # [k, l]
                if p is None:  # a dummy pass: an exact 0 that reaches every parameter
                    out = out + 0.0 * value.sum().to(out.device, out.dtype)
                    continue
                out = _write_rows(out, p.rows, torch.where(reads.mask, value, 0.0))
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
