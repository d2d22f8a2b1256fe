"""How many tokens one forward/backward pass may hold on a GPU (verl's ``ppo_max_token_len_per_gpu``, chosen for you).

When ``optim.micro_batch_tokens`` is not set, a model on a CUDA device gets a token budget per pass
from its shape and the device's memory (:func:`auto_token_budget`), computed once, at the model's
first pass, so that a run's passes are planned the same way at every step:

    budget = (share * device memory - memory allocated now - gradients and AdamW state to come)
             / (activation bytes per token, x 1.5)

with ``share`` = ``parallel.memory_share`` (0.85 by default, :data:`DEVICE_SHARE`).

The activation bytes per token of a training pass (:func:`activation_bytes_per_token`) count, in
the model's dtype: with activation checkpointing, each layer's input (kept for the recomputation)
plus one layer's intermediate tensors and their gradients during its backward pass; without it,
every layer's intermediate tensors. The log-probabilities never hold ``[tokens x vocabulary]``
(:mod:`seeupo.llm.logprobs`), so the vocabulary adds only a fixed chunk. The 1.5 covers what the
count leaves out (allocator fragmentation, the attention kernel's own buffers). Measured so far on
one H100 with the Qwen3-1.7B shape (``benchmarks/gpu_step.py``): every step under this budget ran
without running out of memory (policy budget 110,397 tokens with checkpointing, 52,295 when the
checkpointed layers keep their attention as below, with a peak of at most 33.0 GiB at the BFCL shape);
with checkpointing off, a 14,771-token pass (its budget) estimated at 32 GiB of
activations peaked at 52 GiB with about 13 GiB of weights and optimizer state: the count is low by
about a fifth, which the 1.5 covers.

With checkpointing ``"as_needed"`` (:func:`recomputing`) a pass smaller than the budget recomputes
only the layers it must (:func:`recomputed_layers`) to stay within a fully checkpointed pass's
memory at the budget: its peak rises towards ``share`` of the device's memory, so the share is
what bounds it. Measured at the BFCL shape (Qwen3-1.7B): 43.1 GiB on an 80 GB H100 at share 0.85,
27.7 GiB at 0.5, 91.3 GiB on a 141 GB H200 at 0.85 (benchmarks/RESULTS.md).

On the CPU there is no budget (``None``): memory is the machine's, and a pass takes what it needs.

A checkpointed layer also keeps its attention kernel's inputs and output (q, k, v, the output and
its log-sum-exp: 12 KiB per token per layer at Qwen3-1.7B in bf16, three times the layer input it
keeps anyway) unless ``keep_attention=False`` is given to
:func:`seeupo.llm.distributed.enable_activation_checkpointing`: the recomputation then replays the
attention output (:func:`checkpointed_attention`) instead of running the kernel again, which is
the most expensive part of a long-context layer to recompute. The replayed output is the one the
recomputation would compute from the same inputs; the tests check the gradients against the full
recomputation (to 1e-12 in float64 on the CPU, to 1e-6 in float32 with flex on CUDA) and count the
kernel's calls.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, TypeVar

import torch

# the share of the device's memory a run plans to use by default (``parallel.memory_share``), and
# the margin on the per-token estimate
DEVICE_SHARE = 0.85
ESTIMATE_MARGIN = 1.5


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def activation_bytes_per_token(config: Any, dtype: torch.dtype, checkpointing: bool, training: bool = True,
                               recomputed: int | None = None, keep_attention: bool = False) -> float:
    """Bytes of activations one token of a pass keeps alive at the peak (see the module docstring).

    ``config``: a transformers decoder config (``hidden_size``, ``intermediate_size``,
    ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``).
    ``training=False`` (a model that gets no gradient, e.g. the frozen reference): nothing is kept
    for a backward pass, so only one layer's intermediate tensors are alive at a time.
    ``recomputed``: with checkpointing, how many layers are recomputed (the others keep their
    intermediate tensors; :func:`recomputed_layers`); ``None``: every layer.
    ``keep_attention``: a recomputed layer also keeps its attention kernel's q, k, v, output and
    float32 log-sum-exp (module docstring).
    """
    config = _text_config(config)
    hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    size = torch.finfo(dtype).bits // 8
    # q, k, v, the attention output, the residual stream, two norms' outputs, the output
    # projection's, and the MLP's gate, up, activation and product
    layer = (2 * heads * head_dim + 2 * kv * head_dim + 5 * hidden + 4 * inter) * size
    final = 4 * hidden * 4  # the final norm and the head's input, upcast to float32 for the log-probabilities
    if not training:
        return layer + final
    recomputed = (layers if recomputed is None else recomputed) if checkpointing else 0
    if not 0 <= recomputed <= layers:
        raise ValueError(f"recomputed must be within 0..{layers}, got {recomputed}")
    # a recomputed layer keeps its input, the others their intermediate tensors; while one layer is
    # recomputed, its intermediate tensors and their gradients are alive too
    attention = (2 * heads * head_dim + 2 * kv * head_dim) * size + heads * 4 if keep_attention else 0
    kept = recomputed * (hidden * size + attention) + (layers - recomputed) * layer
    return kept + (2 * layer if recomputed else 0) + final


def recomputed_layers(config: Any, dtype: torch.dtype, tokens: int, budget: int, keep_attention: bool = False) -> int:
    """How many decoder layers a training pass of ``tokens`` tokens recomputes with activation
    checkpointing ``"as_needed"``: the fewest that keep the pass's activations
    (:func:`activation_bytes_per_token`) within those of a fully checkpointed pass of ``budget``
    tokens (the most a pass may hold, :func:`auto_token_budget`). 0 where the pass fits without
    checkpointing; every layer at the budget and beyond. ``keep_attention``: as the model's
    checkpointing (:func:`activation_bytes_per_token`).
    """
    layers = _text_config(config).num_hidden_layers
    allowed = budget * activation_bytes_per_token(config, dtype, checkpointing=True, keep_attention=keep_attention)
    for k in range(layers + 1):
        if tokens * activation_bytes_per_token(config, dtype, True, recomputed=k, keep_attention=keep_attention) <= allowed:
            return k
    return layers


def token_budget(config: Any, dtype: torch.dtype, checkpointing: bool, trainable: bool, *, total: int, allocated: int,
                 reserve: int, share: float = DEVICE_SHARE, keep_attention: bool = False) -> int:
    """The tokens one pass may hold (module docstring), from the device's memory in bytes:
    ``(share * total - allocated - reserve) / (ESTIMATE_MARGIN * activation bytes per token)``,
    at least 0. ``total``: the device's memory; ``allocated``: what is allocated now (weights,
    ...); ``reserve``: what will be (gradients and AdamW state); ``share`` in (0, 1];
    ``keep_attention``: as :func:`activation_bytes_per_token`."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    free = share * total - allocated - reserve
    per_token = ESTIMATE_MARGIN * activation_bytes_per_token(config, dtype, checkpointing, trainable,
                                                             keep_attention=keep_attention)
    return max(int(free // per_token), 0)


def auto_token_budget(model: torch.nn.Module, checkpointing: bool, trainable: bool = True,
                      share: float = DEVICE_SHARE) -> int | None:
    """:func:`token_budget` of ``model`` on its CUDA device, read now; ``None`` on the CPU.

    ``trainable``: the model will get gradients and AdamW state (two moments in the parameters'
    dtype); when none of its parameters has a gradient yet, their memory is reserved now. A model
    that is not trainable (the frozen reference) keeps no activations for a backward pass.
    ``share``: the share of the device's memory the run plans to use, in (0, 1].
    """
    param = next(model.parameters())
    if param.device.type != "cuda":
        return None
    device = param.device
    reserve = 0
    if trainable:
        params = [p for p in model.parameters() if p.requires_grad]
        if all(p.grad is None for p in params):
            reserve = 3 * sum(p.numel() * p.element_size() for p in params)
    return token_budget(model.config, param.dtype, checkpointing, trainable, share=share, reserve=reserve,
                        keep_attention=keeps_attention(model),
                        total=torch.cuda.get_device_properties(device).total_memory,
                        allocated=torch.cuda.memory_allocated(device))


# set on a model whose activation checkpointing is "as_needed" (:func:`recomputing`)
AS_NEEDED = "_seeupo_recompute_as_needed"


@contextlib.contextmanager
def recomputing(model: torch.nn.Module, tokens: int, budget: int | None) -> Iterator[int | None]:
    """Within the block, a training pass of ``tokens`` tokens through ``model`` recomputes only its
    first :func:`recomputed_layers` decoder layers, where ``model``'s activation checkpointing is
    ``"as_needed"`` (``enable_activation_checkpointing(model, as_needed=True)``), a gradient is
    taken and there is a ``budget``; yields that number (``None``: nothing changed). The choice is
    made as the layers run forward (the recomputation replays what they saved), so the backward
    pass may come after the block.
    """
    if budget is None or not getattr(model, AS_NEEDED, False) or not torch.is_grad_enabled():
        yield None
        return
    from seeupo.llm.distributed import decoder_layers

    layers = decoder_layers(model)
    dtype = next(model.parameters()).dtype
    count = recomputed_layers(model.config, dtype, tokens, budget, keeps_attention(model))
    was = [layer.gradient_checkpointing for layer in layers]
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = was[i] and i < count
    try:
        yield count
    finally:
        for layer, on in zip(layers, was):
            layer.gradient_checkpointing = on


def is_checkpointed(model: torch.nn.Module) -> bool:
    """Whether transformers recomputes ``model``'s layers in the backward pass (activation checkpointing on)."""
    return any(getattr(m, "gradient_checkpointing", False) and m.training for m in model.modules())


# --- the attention kernel's output, kept through the recomputation ------------------------------

# set on a model whose checkpointed layers keep their attention's inputs and output
KEEPS_ATTENTION = "_seeupo_checkpoint_keeps_attention"

_mode = threading.local()  # the recomputation runs on the autograd engine's thread: each thread its own mode
_Output = TypeVar("_Output")


def keeps_attention(model: torch.nn.Module) -> bool:
    """Whether ``model``'s checkpointed layers keep their attention kernel's inputs and output."""
    return getattr(model, KEEPS_ATTENTION, False)


class _KeptOutputs:
    """The attention outputs of one checkpointed layer call, in the order they were computed."""

    def __init__(self) -> None:
        self.outputs: list[Any] = []
        self.replayed = 0


@contextlib.contextmanager
def _attention_mode(mode: str, kept: _KeptOutputs) -> Iterator[None]:
    was = getattr(_mode, "value", None)
    _mode.value = (mode, kept)
    kept.replayed = 0
    try:
        yield
    finally:
        _mode.value = was


def attention_keeping_contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """``context_fn`` of ``torch.utils.checkpoint.checkpoint`` (non-reentrant): the layer's forward
    records what its attention kernel returns (:func:`checkpointed_attention`), its recomputation
    replays it. The checkpoint keeps both contexts until the layer's backward pass is done."""
    kept = _KeptOutputs()
    return _attention_mode("record", kept), _attention_mode("replay", kept)


def _same(tensor: Any) -> Any:
    return tensor


def checkpointed_attention(kernel: Callable[[], _Output]) -> _Output:
    """``kernel()``, an attention kernel's call inside a decoder layer.

    Outside a checkpointed layer that keeps attention (:func:`attention_keeping_contexts`): just
    the call. In the layer's forward: the call, with what the kernel saves for its backward pass
    kept in memory (the checkpoint would drop it and recompute it), and its output recorded. In
    the layer's recomputation: the recorded output, without calling the kernel (the backward
    pass runs through the forward's graph, where the kernel's node still has what it saved).
    """
    mode = getattr(_mode, "value", None)
    if mode is None:
        return kernel()
    step, kept = mode
    if step == "record":
        with torch.autograd.graph.saved_tensors_hooks(_same, _same):
            output = kernel()
        kept.outputs.append(output)
        return output
    if kept.replayed >= len(kept.outputs):
        raise RuntimeError("the recomputation called attention more often than the layer's forward pass did")
    output = kept.outputs[kept.replayed]
    kept.replayed += 1
    return output
