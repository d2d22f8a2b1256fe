"""Log-probabilities of taken tokens from a language model's last hidden states, without the ``[N, V]`` tensor.

A causal LM's head maps a hidden state ``h [H]`` to logits ``h @ W.T (+ b)`` over a vocabulary of
``V`` tokens, and the log-probability of token ``t`` at temperature ``tau`` is::

    log p(t) = z_t - logsumexp_v z_v,        z = (h @ W.T + b) / tau

computed in at least float32. With ``N`` read positions the plain computation
(:func:`token_logprobs_reference`, what :class:`~seeupo.llm.policy.CausalLMPolicy` computes from
the model's logits) materialises ``[N, V]`` logits several times over (the head's output in the
weights' dtype, its float32 copy divided by the temperature, the ``log_softmax`` kept for the
backward pass): at Qwen3's ``V = 151,936`` and 12,000 positions, 17 GiB to score and 20 GiB to
update (``benchmarks/logprob_memory.py``, bf16 on an H200). :func:`token_logprobs_chunked` gives the same numbers and
gradients while holding only one chunk of rows' logits at a time and saving nothing of size ``V``
per row for the backward pass (it recomputes each chunk's logits there). :func:`token_logprobs_liger`
does the same with liger-kernel's fused Triton kernel on CUDA. :func:`logprob_backend` picks one by
name (:data:`LogprobPath`).

Every function here takes ``hidden [N, H]`` (the model's final hidden states at the positions that
predict the taken tokens, after the final norm), ``weight [V, H]`` and optional ``bias [V]`` (the
LM head, :func:`head_of`), ``target [N]`` (the taken token ids, ``long``) and ``temperature > 0``,
and returns ``[N]`` log-probabilities in ``promote_types(hidden.dtype, float32)``. ``hidden`` and
``weight`` must share a dtype (as for ``nn.Linear``); nothing here runs under autocast.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import re
from typing import Callable, Literal, get_args

import torch
import torch.nn.functional as F

from seeupo.core.losses import entropy_of_log_probs

Tensor = torch.Tensor

LogprobPath = Literal["auto", "chunked", "reference", "liger"]
"""How token log-probabilities are computed (:func:`logprob_backend`): ``"auto"`` picks ``"liger"``
where it can run, else ``"chunked"``."""

TokenLogprobs = Callable[..., Tensor]
"""``fn(hidden, weight, target, temperature, bias=None) -> [N]``: the signature of every path."""

# one chunk's float32 logits are about this many elements (2**26 x 4 bytes = 256 MiB)
_CHUNK_ELEMENTS = 2**26

# the first liger-kernel whose reduction="none" backward weights each token's gradient before
# summing it into the head's gradient (liger-kernel PR #1298); older ones scale the summed
# gradient by one number and get grad_weight wrong
_LIGER_MIN_VERSION = (0, 8, 2)

# transformers causal LMs whose logits are exactly lm_head(final hidden state) (read in
# transformers 5.24's modeling code); others may scale or soft-cap the logits after the head (Gemma 2/3:
# final_logit_softcapping, Cohere: logit_scale, Granite: logits_scaling) and must use the
# model's own logits (the reference path)
_PLAIN_HEAD_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "smollm3", "gemma", "phi3", "olmo2",
})
# config fields that change the logits after the head (any model type): a belt to the list's braces
_LOGIT_CHANGING_FIELDS = (
    "final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier", "mup_enabled",
)


def _check(hidden: Tensor, weight: Tensor, target: Tensor, temperature: float, bias: Tensor | None) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or target.dim() != 1:
        raise ValueError(f"expected hidden [N, H], weight [V, H], target [N]; got {tuple(hidden.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(target.shape)}")
    if hidden.shape[0] != target.shape[0] or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"shapes do not match: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}, "
                         f"target {tuple(target.shape)}")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share a dtype, as for nn.Linear")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [V] = [{weight.shape[0]}], got {tuple(bias.shape)}")
    if target.dtype != torch.long:
        raise ValueError(f"target must be long token ids, got {target.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def token_logprobs_reference(
    hidden: Tensor, weight: Tensor, target: Tensor, temperature: float, bias: Tensor | None = None
) -> Tensor:
    """``log softmax((hidden @ weight.T + bias) / temperature)[target]``, the plain way.

    The logits ``[N, V]`` are computed in the weights' dtype (as ``nn.Linear`` does), cast to
    ``promote_types(dtype, float32)``, divided by ``temperature``, ``log_softmax``-ed over the
    vocabulary, and the target's entry gathered: exactly what
    :meth:`~seeupo.llm.policy.CausalLMPolicy.log_probs` does with a model's logits. Autograd keeps
    the ``[N, V]`` log-softmax for the backward pass.

    Args:
      hidden: ``[N, H]`` final hidden states.
      weight: ``[V, H]`` LM head (or tied embedding) matrix, in ``hidden``'s dtype.
      target: ``[N]`` long token ids in ``[0, V)``.
      temperature: ``tau > 0``.
      bias: optional ``[V]`` head bias.

    Returns:
      ``[N]`` log-probabilities in ``promote_types(hidden.dtype, float32)``.
    """
    _check(hidden, weight, target, temperature, bias)
    dtype = torch.promote_types(weight.dtype, torch.float32)
    logits = F.linear(hidden, weight, bias)
    logp = torch.log_softmax(logits.to(dtype) / temperature, dim=-1)
    return logp.gather(1, target[:, None]).squeeze(1)


def default_chunk_rows(vocab_size: int) -> int:
    """Rows per chunk of :func:`token_logprobs_chunked`: one chunk's float32 logits are about 256 MiB."""
    return max(1, _CHUNK_ELEMENTS // max(vocab_size, 1))


def _chunk_logits(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float, dtype: torch.dtype
) -> Tensor:
    """``(hidden @ weight.T + bias)`` in the weights' dtype, then in ``dtype`` divided by ``temperature``.

    The same operations, in the same order, as :func:`token_logprobs_reference`, so that each
    logit is the same number. ``.to`` makes a new tensor (or returns ``linear``'s own output), so
    the in-place division touches nothing else.
    """
    return F.linear(hidden, weight, bias).to(dtype).div_(temperature)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """:func:`token_logprobs_chunked`'s forward and backward (see there)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, temperature: float,
                chunk_rows: int) -> Tensor:
        n = hidden.shape[0]
        dtype = torch.promote_types(weight.dtype, torch.float32)
        logp = torch.empty(n, dtype=dtype, device=hidden.device)
        lse = torch.empty(n, dtype=dtype, device=hidden.device)
        for start in range(0, n, chunk_rows):
            rows = slice(start, start + chunk_rows)
            z = _chunk_logits(hidden[rows], weight, bias, temperature, dtype)
            z_target = z.gather(1, target[rows, None]).squeeze(1)
            # logsumexp in place (torch.logsumexp would allocate another [rows, V] tensor);
            # the logits are finite, so subtracting the row's maximum is safe
            top = z.amax(dim=1)
            lse[rows] = top + z.sub_(top[:, None]).exp_().sum(dim=1).log_()
            logp[rows] = z_target - lse[rows]
            del z  # before the next chunk's logits exist: one chunk alive at a time, not two
        # only the inputs and one number per row: the backward pass recomputes each chunk's logits
        ctx.save_for_backward(hidden, weight, bias, target, lse)
        ctx.temperature = temperature
        ctx.chunk_rows = chunk_rows
        return logp

    @staticmethod
    def backward(ctx, grad_logp: Tensor):
        hidden, weight, bias, target, lse = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        tau, chunk_rows = ctx.temperature, ctx.chunk_rows
        dtype = lse.dtype
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # the head's gradient sums over every row: accumulate it in at least float32 (a bf16
        # running sum would lose the small chunks' contributions), cast once at the end
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=dtype, device=bias.device) if need_bias else None
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            h, t, g = hidden[rows], target[rows], grad_logp[rows].to(dtype)
            # d logp_i / d z_iv = onehot(t_i)_v - softmax(z_i)_v, and z = logits / tau
            grad_z = _chunk_logits(h, weight, bias, tau, dtype).sub_(lse[rows, None]).exp_()  # softmax
            grad_z.mul_(-g[:, None]).scatter_add_(1, t[:, None], g[:, None]).div_(tau)
            # the logits were computed in the weights' dtype: their gradient flows back in it,
            # as autograd does through the reference's cast
            grad_logits = grad_z.to(weight.dtype)
            if need_hidden:
                grad_hidden[rows] = grad_logits @ weight
            if need_weight and grad_logits.dtype == dtype:
                grad_weight.addmm_(grad_logits.T, h)
            elif need_weight:  # a bf16 product per chunk, summed in float32 (add_ casts elementwise)
                grad_weight.add_(grad_logits.T @ h)
            if need_bias:  # summed before the cast: free, and no rounding per chunk
                grad_bias.add_(grad_z.sum(0))
            del grad_z, grad_logits  # one chunk alive at a time
        if need_weight:
            grad_weight = grad_weight.to(weight.dtype)
        if need_bias:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def token_logprobs_chunked(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    temperature: float,
    bias: Tensor | None = None,
    chunk_rows: int | None = None,
) -> Tensor:
    """:func:`token_logprobs_reference`'s numbers and gradients, ``chunk_rows`` rows of logits at a time.

    Forward: for each chunk of rows, the logits in the weights' dtype, cast to
    ``promote_types(dtype, float32)`` and divided by ``temperature`` (the reference's operations,
    so the same logits), their ``logsumexp`` ``lse`` and the target's logit ``z_t``;
    ``log p = z_t - lse``. Only ``hidden``, ``weight``, ``bias``, ``target`` and ``lse [N]`` are
    saved for the backward pass: ``O(N*H + V*H)``, nothing of size ``V`` per row.

    Backward: each chunk's logits are recomputed, and with ``g`` the incoming gradient,
    ``grad_logits = g * (onehot(target) - softmax(z)) / temperature``, then
    ``grad_hidden = grad_logits @ weight`` and ``grad_weight += grad_logits.T @ hidden`` (and
    ``grad_bias += grad_logits.sum(0)``), in the weights' dtype as autograd would: the head's
    gradient is one product per chunk in the weights' dtype, summed over chunks in at least
    float32 and cast once; the bias's is summed in float32 before any cast. Gradients are computed only
    for the inputs that require them (a frozen reference head: none for ``weight``); a tied
    embedding gets this gradient added to its embedding one by autograd. No double backward.

    The values equal the reference's up to the rounding of ``logsumexp`` against ``log_softmax``
    (float64: ~1e-15, float32: ~1e-6), and so do the gradients; in bf16 the head's and bias's
    gradients differ from the reference's by a few bf16 roundings (one per chunk instead of one
    overall; both are as close to the float64 truth, see the tests).

    Args:
      hidden, weight, target, temperature, bias: as for :func:`token_logprobs_reference`.
      chunk_rows: rows per chunk (``None``: :func:`default_chunk_rows`, ~256 MiB of float32 logits).
        Peak extra memory is a few ``[chunk_rows, V]`` tensors; the speed is the same as the
        reference's once a chunk's matrix product fills the device.

    Returns:
      ``[N]`` log-probabilities in ``promote_types(hidden.dtype, float32)``.
    """
    _check(hidden, weight, target, temperature, bias)
    rows = _chunk_rows(weight, chunk_rows)
    return _ChunkedTokenLogprobs.apply(hidden, weight, bias, target, float(temperature), rows)


def _chunk_rows(weight: Tensor, chunk_rows: int | None) -> int:
    """``chunk_rows``, or :func:`default_chunk_rows` for ``weight``'s vocabulary; at least 1."""
    rows = default_chunk_rows(weight.shape[0]) if chunk_rows is None else int(chunk_rows)
    if rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    return rows


def _chunk_entropies(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """``[rows]``: the entropy of each of ``hidden``'s rows' ``softmax((hidden @ weight.T + bias) / temperature)``, in
    ``promote_types(weight.dtype, float32)`` (the logits as :func:`token_logprobs_reference` computes them)."""
    dtype = torch.promote_types(weight.dtype, torch.float32)
    return entropy_of_log_probs(torch.log_softmax(F.linear(hidden, weight, bias).to(dtype) / temperature, dim=-1))


def token_entropies_reference(hidden: Tensor, weight: Tensor, temperature: float, bias: Tensor | None = None) -> Tensor:
    """``[N]`` the entropy ``-sum_v p_v log p_v`` of each position's whole conditional ``p = softmax((hidden @ weight.T
    + bias) / temperature)``, the plain way (the ``[N, V]`` log-softmax kept for the backward pass)."""
    _check(hidden, weight, torch.zeros(hidden.shape[0], dtype=torch.long), temperature, bias)
    return _chunk_entropies(hidden, weight, bias, temperature)


def token_entropies(hidden: Tensor, weight: Tensor, temperature: float, bias: Tensor | None = None,
                    chunk_rows: int | None = None) -> Tensor:
    """:func:`token_entropies_reference`'s numbers and gradients, ``chunk_rows`` rows of logits at a time.

    Each chunk runs under ``torch.utils.checkpoint``: its ``[chunk_rows, V]`` logits exist only while it is computed,
    in the forward pass and again in the backward pass, and nothing of size ``V`` per row is kept between them (as
    :func:`token_logprobs_chunked`). Autograd differentiates the reference's own operations, so the values and
    gradients are the reference's up to the order of the vocabulary sums. What an entropy bonus
    (``AlgorithmConfig.entropy_coef``) reads beside the log-probabilities of any path of :func:`logprob_backend`.
    """
    from torch.utils.checkpoint import checkpoint

    _check(hidden, weight, torch.zeros(hidden.shape[0], dtype=torch.long), temperature, bias)
    rows = _chunk_rows(weight, chunk_rows)
    chunks = [checkpoint(_chunk_entropies, hidden[start: start + rows], weight, bias, float(temperature),
                         use_reentrant=False) for start in range(0, hidden.shape[0], rows)]
    if not chunks:
        return torch.zeros(0, dtype=torch.promote_types(weight.dtype, torch.float32), device=hidden.device)
    return torch.cat(chunks)


def liger_unavailable(device: torch.device | str) -> str | None:
    """Why :func:`token_logprobs_liger` cannot run on ``device`` (a one-line reason), or ``None`` if it can."""
    return _liger_unavailable(torch.device(device).type)


@functools.lru_cache(maxsize=None)  # the answer does not change within a process; the import is slow once
def _liger_unavailable(device_type: str) -> str | None:
    if device_type != "cuda":
        return f"liger-kernel's Triton kernels need a CUDA device, not {device_type}"
    try:
        version = importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return "liger-kernel is not installed"
    if _release(version) < _LIGER_MIN_VERSION:
        return (f"liger-kernel {version} computes wrong head gradients with reduction='none' "
                f"(needs >= {'.'.join(map(str, _LIGER_MIN_VERSION))})")
    try:
        importlib.import_module("liger_kernel.transformers.functional")  # Triton and its compiler must load
    except Exception as err:  # an ImportError, or Triton failing to find its compiler
        return f"liger-kernel does not import: {type(err).__name__}: {err}"
    return None


def _release(version: str) -> tuple[int, ...]:
    """``"0.8.2.dev2026"`` or ``"0.8.2rc1"`` -> ``(0, 8, 2)``: the release numbers of a version string."""
    numbers = []
    for part in version.split(".")[:3]:
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


def token_logprobs_liger(
    hidden: Tensor, weight: Tensor, target: Tensor, temperature: float, bias: Tensor | None = None
) -> Tensor:
    """:func:`token_logprobs_reference`'s numbers with liger-kernel's fused linear cross-entropy (CUDA).

    ``log p = -cross_entropy``, from ``liger_fused_linear_cross_entropy(..., reduction="none")``,
    which chunks the rows like :func:`token_logprobs_chunked` in Triton kernels (its softmax in
    float32) and recomputes the chunks in the backward pass. liger has no temperature: it gets
    ``hidden / temperature`` (and ``bias / temperature``), the same logits mathematically; in
    bf16 the division rounds ``hidden`` once more, so the values differ from the reference's by
    about one bf16 rounding of the logits. The head's gradient is accumulated in float32. Needs
    liger-kernel >= 0.8.2 and CUDA (:func:`liger_unavailable`); imported on first call only.

    Args and returns: as for :func:`token_logprobs_reference` (float64 inputs give float32-accurate
    values in float64).
    """
    _check(hidden, weight, target, temperature, bias)
    dtype = torch.promote_types(weight.dtype, torch.float32)
    if hidden.shape[0] == 0:  # liger launches a kernel grid per row: none for no rows
        return token_logprobs_chunked(hidden, weight, target, temperature, bias)
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    if temperature != 1.0:
        hidden = hidden / temperature
        bias = None if bias is None else bias / temperature
    loss = liger_fused_linear_cross_entropy(
        hidden, weight, target.contiguous(), bias=bias, reduction="none",
        accum_dtype=torch.float32 if weight.dtype in (torch.bfloat16, torch.float16) else None,
    )
    return -loss.to(dtype)


_PATHS: dict[str, TokenLogprobs] = {
    "reference": token_logprobs_reference,
    "chunked": token_logprobs_chunked,
    "liger": token_logprobs_liger,
}


def logprob_backend(name: LogprobPath, device: torch.device | str) -> TokenLogprobs:
    """The token log-probability function ``name`` names, for tensors on ``device``.

    Every one is called as ``fn(hidden, weight, target, temperature, bias=None) -> [N]``.

    ``"reference"``: :func:`token_logprobs_reference`; ``"chunked"``: :func:`token_logprobs_chunked`;
    ``"liger"``: :func:`token_logprobs_liger` (a ``ValueError`` saying why where it cannot run);
    ``"auto"``: liger where it can run (CUDA, liger-kernel >= 0.8.2 importable), else chunked.
    """
    if name not in get_args(LogprobPath):
        raise ValueError(f"unknown log-prob path {name!r}; expected one of {get_args(LogprobPath)}")
    if name == "auto":
        return token_logprobs_liger if liger_unavailable(device) is None else token_logprobs_chunked
    if name == "liger":
        reason = liger_unavailable(device)
        if reason is not None:
            raise ValueError(f"log-prob path 'liger' cannot run: {reason}")
    return _PATHS[name]


def head_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model``'s logits are not ``lm_head(final hidden state)`` (a one-line reason), or ``None`` if they are.

    Only then may :func:`head_of`'s weight and bias replace the model's logits. Known plain model
    types only (Llama, Mistral, Mixtral, Qwen2/3 and their MoE, SmolLM3, Gemma 1, Phi-3, OLMo 2):
    others may soft-cap or scale the logits after the head, and those must use the model's own
    logits (the reference path).
    """
    config = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if config is None or head is None:
        return f"{type(model).__name__} has no transformers config or output embeddings"
    if not isinstance(head, torch.nn.Linear):
        return f"its output embeddings are a {type(head).__name__}, not an nn.Linear"
    model_type = getattr(config, "model_type", None)
    if model_type not in _PLAIN_HEAD_MODEL_TYPES:
        return f"model type {model_type!r} is not known to compute its logits as lm_head(hidden) alone"
    for cfg in (config, getattr(config, "text_config", None)):
        for field in _LOGIT_CHANGING_FIELDS:
            value = getattr(cfg, field, None) if cfg is not None else None
            if value not in (None, False, 1, 1.0):
                return f"its config sets {field}={value!r}: the logits are changed after the head"
    return None


def head_of(model: torch.nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """``(weight [V, H], bias [V] or None)`` of ``model``'s LM head, or ``None`` where its logits are more than that.

    ``None`` when :func:`head_unsupported` gives a reason (ask it why). The weight is the
    parameter itself (with tied embeddings, the embedding matrix), so gradients reach it.
    """
    if head_unsupported(model) is not None:
        return None
    head = model.get_output_embeddings()
    return head.weight, head.bias
