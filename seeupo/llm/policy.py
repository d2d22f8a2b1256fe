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

How the passes are planned and built (rows, limits, inputs, reads): :mod:`seeupo.llm.passes`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from typing import Iterable, Iterator, get_args

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.parallel import DataParallel
from seeupo.llm.config import Scoring
from seeupo.core.losses import entropy_of_log_probs
from seeupo.llm.logprobs import LogprobPath, TokenLogprobs, head_unsupported, logprob_backend, token_entropies
from seeupo.llm.memory import DEVICE_SHARE
from seeupo.llm.passes import (_AutoBudget, _merged_by_trajectory, _pass_inputs, _plan, _plan_kernel, _Reads,
                               _recomputing, _write_rows, effective_scoring, micro_batches, shared_micro_batches,
                               tree_kernel)

Tensor = torch.Tensor

# the pass planning moved to seeupo.llm.passes; its public names stay importable from here
__all__ = [
    "CausalLMPolicy", "ReferencePolicy", "ValueModel", "clipped_value_loss", "effective_scoring", "micro_batches",
    "plain_head", "shared_micro_batches", "trainable_parameters", "tree_kernel",
]


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

    def token_logps_and_entropies(self, batch: SampleBatch) -> tuple[Tensor, Tensor]:
        """:meth:`token_logps` and ``[n, L]`` the entropy of each response token's whole conditional (what an
        entropy bonus, ``AlgorithmConfig.entropy_coef``, reads; verl's ``entropy_from_logits``), from the same
        forward passes: the log-probabilities by the configured ``logprobs`` path (the numbers :meth:`token_logps`
        gives), the entropies by :func:`seeupo.llm.logprobs.token_entropies` from the same hidden states (the head's
        logits recomputed in chunks: liger's kernel gives no entropy). Both differentiable; 0 off the response
        tokens."""
        return self.log_probs(batch, self.temperature, with_entropy=True)  # type: ignore[return-value]

    def token_entropies(self, batch: SampleBatch) -> Tensor:
        """The entropies of :meth:`token_logps_and_entropies` alone (the core's optional ``Policy`` hook)."""
        return self.token_logps_and_entropies(batch)[1]

    def log_probs(self, batch: SampleBatch, temperature: float | None = None,
                  with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """:meth:`token_logps` at another temperature (``None``: the policy's own); ``with_entropy``: and the
        entropies, as :meth:`token_logps_and_entropies` gives them."""
        tau = self.temperature if temperature is None else float(temperature)
        n, L = batch.token_mask.shape
        param = next(self.model.parameters())
        # softmax in at least float32: bf16/fp16 log-probabilities are too coarse for ratios
        dtype = torch.promote_types(param.dtype, torch.float32)
        out = torch.zeros(n, L, dtype=dtype, device=batch.token_mask.device)
        entropies = torch.zeros(n, L, dtype=dtype, device=batch.token_mask.device) if with_entropy else None
        head = logprob_backend(self.logprobs, param.device)
        if with_entropy:  # the log-probabilities of the configured path (those a scoring pass gives), then entropies
            head = functools.partial(_with_entropies, head)
        passes, kernel = _plan(self, self.model, batch, self.micro_batch_rows, self.micro_batch_tokens, self.collective)
        calls = [(p, *_pass_inputs(batch, p, param.device, kernel, self._head is None and self._keeps_logits))
                 for p in passes]
        with _recomputing(self.model, calls, self._budget):
            while calls:  # each pass's inputs (its tree mask's block mask too) are dropped once it ran
                p, inputs, reads = calls.pop(0)
                if self._head is not None:  # the head gives the log-probabilities of the read tokens only
                    with _head_gives_logprobs(self.model, self._head, reads, tau, head):
                        per_token = self.model(**inputs).logits
                else:  # the model's own logits (every position of the pass), then the read ones
                    per_token = _logprobs_of_logits(reads.pick(self.model(**inputs).logits), reads.target, tau,
                                                    with_entropy)
                if p is None:  # a dummy pass: an exact 0 that reaches every parameter
                    out = out + 0.0 * per_token.sum().to(out.device, out.dtype)
                    continue
                if entropies is not None:  # [k, l, 2]: the log-probabilities, then the entropies
                    entropies = _write_rows(entropies, p.rows, torch.where(reads.mask, per_token[..., 1], 0.0))
                    per_token = per_token[..., 0]
                out = _write_rows(out, p.rows, torch.where(reads.mask, per_token, 0.0))
        return (out, entropies) if entropies is not None else out


def _with_entropies(logprobs: TokenLogprobs, hidden: Tensor, weight: Tensor, target: Tensor, temperature: float,
                    bias: Tensor | None = None) -> Tensor:
    """``[N, 2]``: ``logprobs``' log-probabilities and :func:`~seeupo.llm.logprobs.token_entropies` (a head's
    per-token function, as :class:`_LogprobHead` calls it)."""
    return torch.stack([logprobs(hidden, weight, target, temperature, bias=bias),
                        token_entropies(hidden, weight, temperature, bias)], dim=-1)


def _logprobs_of_logits(logits: Tensor, target: Tensor, temperature: float, with_entropy: bool = False) -> Tensor:
    """``log softmax(logits / temperature)[target]`` in at least float32 (bf16/fp16 log-probabilities are too
    coarse for ratios): ``[...]`` from ``logits [..., V]`` and ``target [...]``; ``with_entropy``: ``[..., 2]``, the
    entropy of each position's whole distribution beside it."""
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, dim=-1)
    picked = logp.gather(-1, target[..., None]).squeeze(-1)
    return torch.stack([picked, entropy_of_log_probs(logp)], dim=-1) if with_entropy else picked


class _LogprobHead(torch.nn.Module):
    """Stands in for a causal LM's head for one call: the log-probabilities of the read tokens, not logits."""

    def __init__(self, head: torch.nn.Linear, reads: "_Reads", temperature: float, logprobs: TokenLogprobs) -> None:
        super().__init__()
        self.head, self.reads, self.temperature, self.logprobs = head, reads, temperature, logprobs

    def forward(self, hidden: Tensor) -> Tensor:
        picked = self.reads.pick(hidden)  # [k, l, H]
        flat = self.logprobs(picked.reshape(-1, picked.shape[-1]), self.head.weight, self.reads.target.reshape(-1),
                             self.temperature, bias=self.head.bias)
        return flat.reshape(*self.reads.target.shape, *flat.shape[1:])  # [k, l] (or [k, l, 2] with the entropies)


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
