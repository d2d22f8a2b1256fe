"""How many tokens one forward/backward pass may hold on a GPU (verl's ``ppo_max_token_len_per_gpu``, chosen for you).

When ``optim.micro_batch_tokens`` is not set, a model on a CUDA device gets a token budget per pass
from its shape and the device's memory (:func:`auto_token_budget`), computed once, at the model's
first pass, so that a run's passes are planned the same way at every step:

    budget = (0.85 * device memory - memory allocated now - gradients and AdamW state to come)
             / (activation bytes per token, x 1.5)

The activation bytes per token of a training pass (:func:`activation_bytes_per_token`) count, in
the model's dtype: with activation checkpointing, each layer's input (kept for the recomputation)
plus one layer's intermediate tensors and their gradients during its backward pass; without it,
every layer's intermediate tensors. The log-probabilities never hold ``[tokens x vocabulary]``
(:mod:`seeupo.llm.logprobs`), so the vocabulary adds only a fixed chunk. The 1.5 covers what the
count leaves out (allocator fragmentation, the attention kernel's own buffers). Measured so far: on
one H100 with the Qwen3-1.7B shape (``benchmarks/gpu_step.py``) every step under this budget ran
without running out of memory, peaking at 37.2 GiB; the budget itself was not recorded there, so how
close a pass came to it is not yet known.

On the CPU there is no budget (``None``): memory is the machine's, and a pass takes what it needs.
"""

from __future__ import annotations

from typing import Any

import torch

# the share of the device's memory a run plans to use, and the margin on the per-token estimate
DEVICE_SHARE = 0.85
ESTIMATE_MARGIN = 1.5


def activation_bytes_per_token(config: Any, dtype: torch.dtype, checkpointing: bool, training: bool = True) -> float:
    """Bytes of activations one token of a pass keeps alive at the peak (see the module docstring).

    ``config``: a transformers decoder config (``hidden_size``, ``intermediate_size``,
    ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``).
    ``training=False`` (a model that gets no gradient, e.g. the frozen reference): nothing is kept
    for a backward pass, so only one layer's intermediate tensors are alive at a time.
    """
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
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
    if checkpointing:
        return layers * hidden * size + 2 * layer + final  # the layers' inputs; one layer recomputed, with gradients
    return layers * layer + final


def auto_token_budget(model: torch.nn.Module, checkpointing: bool, trainable: bool = True) -> int | None:
    """The tokens one pass of ``model`` may hold on its CUDA device (module docstring); ``None`` on the CPU.

    ``trainable``: the model will get gradients and AdamW state (two moments in the parameters'
    dtype); when none of its parameters has a gradient yet, their memory is reserved now. A model
    that is not trainable (the frozen reference) keeps no activations for a backward pass.
    """
    param = next(model.parameters())
    if param.device.type != "cuda":
        return None
    device = param.device
    total = torch.cuda.get_device_properties(device).total_memory
    allocated = torch.cuda.memory_allocated(device)
    reserve = 0
    if trainable:
        params = [p for p in model.parameters() if p.requires_grad]
        if all(p.grad is None for p in params):
            reserve = 3 * sum(p.numel() * p.element_size() for p in params)
    free = DEVICE_SHARE * total - allocated - reserve
    per_token = ESTIMATE_MARGIN * activation_bytes_per_token(model.config, param.dtype, checkpointing, trainable)
    return max(int(free // per_token), 0)


def is_checkpointed(model: torch.nn.Module) -> bool:
    """Whether transformers recomputes ``model``'s layers in the backward pass (activation checkpointing on)."""
    return any(getattr(m, "gradient_checkpointing", False) and m.training for m in model.modules())
