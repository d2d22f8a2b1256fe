"""Forward rows that share a token prefix with the prefix computed once, gradients included.

A scoring pass with ``scoring="prefix_shared"`` (:mod:`seeupo.llm.policy`) makes two model calls:

1. the *prefix call* forwards each group's shared prefix once (one row per group) and records
   every layer's keys and values (:class:`_RecordingLayer`);
2. the *suffix call* forwards each row's remaining tokens, attending to its group's prefix
   keys and values (:class:`_SharedPrefixLayer`, the prefix's keys and values selected per row)
   and to its own earlier suffix tokens, at the positions the tokens have in the whole row.

With causal attention, the keys and values of a prefix do not depend on what follows it, so each
suffix token computes what it computes in the whole row (same attention inputs, same position);
the prefix's keys and values stay in the autograd graph, so the backward pass of the suffix call
flows into the prefix call: the same parameter gradients as forwarding every row whole, up to
the floating-point summation order (the tests bound it). This is the public Hugging Face cache
interface (``transformers.cache_utils``), not a custom attention kernel: any model whose layers
all use full attention through it works.

Activation checkpointing: transformers drops the cache of a checkpointed layer unless the layer
allows it (``_can_checkpoint_with_cache``, transformers >= 5.23), because the backward pass's
recomputation would write the cache a second time. Both layers here are safe to recompute: the
recording layer overwrites (never appends) and the shared-prefix layer writes nothing, so
:func:`cache_allowed_under_checkpointing` allows it for the duration of the two calls (the
recomputation reuses the arguments of the forward, cache included).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

import torch

from seeupo.llm.models import cache_argument, keeps_every_key

Tensor = torch.Tensor


def _checkpointed_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules that transformers checkpoints (``gradient_checkpointing`` and ``training`` set)."""
    return [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) and m.training]


def prefix_sharing_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot forward a shared prefix once (a one-line reason), or ``None`` if it can.

    Needs a transformers model that takes a key/value cache and whose layers all use full
    attention (a sliding-window or linear-attention layer keeps a different cache) and, under
    activation checkpointing, a transformers
    that lets a layer keep its cache there (``_can_checkpoint_with_cache``).
    """
    config = getattr(model, "config", None)
    parameters = inspect.signature(model.forward).parameters
    if config is None or not ({"cache", "past_key_values"} & set(parameters)):
        return f"{type(model).__name__} takes no key/value cache"
    if not keeps_every_key(config):
        return "not all its layers are full attention (sliding-window or linear-attention layers)"
    if any(not hasattr(m, "_can_checkpoint_with_cache") for m in _checkpointed_layers(model)):
        return "this transformers version drops the cache of checkpointed layers (needs >= 5.23)"
    return None


@contextlib.contextmanager
def cache_allowed_under_checkpointing(model: torch.nn.Module) -> Iterator[None]:
    """Let ``model``'s checkpointed layers keep the caches of this module (see the module docstring)."""
    layers = _checkpointed_layers(model)
    before = [m.__dict__.get("_can_checkpoint_with_cache") for m in layers]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m, value in zip(layers, before):
            if value is None:
                del m._can_checkpoint_with_cache
            else:
                m._can_checkpoint_with_cache = value


def _cache_classes() -> tuple[type, type]:
    """``(_RecordingLayer, _SharedPrefixLayer)``, defined on first use so that importing this module
    does not import transformers."""
    global _CLASSES
    if _CLASSES is None:
        from transformers.cache_utils import DynamicLayer

        class _RecordingLayer(DynamicLayer):
            """Keeps the keys and values of the prefix call's tokens; returns them unchanged.

            Overwrites instead of appending, so a recomputation (activation checkpointing) records
            the same states again; reports an empty cache so that the call's mask covers its own
            tokens only.
            """

            def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
                self.keys, self.values = key_states, value_states
                self.dtype, self.device = key_states.dtype, key_states.device
                self.is_initialized = True
                return key_states, value_states

            def get_seq_length(self) -> int:
                return 0

        class _SharedPrefixLayer(DynamicLayer):
            """A prefix's keys and values (one row per suffix row) that the suffix call attends to; never written."""

            def __init__(self, keys: Tensor, values: Tensor) -> None:
                super().__init__()
                self.keys, self.values = keys, values
                self.dtype, self.device = keys.dtype, keys.device
                self.is_initialized = True

            def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
                return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)

        _CLASSES = (_RecordingLayer, _SharedPrefixLayer)
    return _CLASSES


_CLASSES: tuple[type, type] | None = None


def _num_layers(model: torch.nn.Module) -> int:
    config = model.config
    return int(getattr(config, "num_hidden_layers", None) or config.get_text_config().num_hidden_layers)


def forward_shared(
    model: torch.nn.Module,
    input_ids: Tensor,
    lengths: Tensor,
    prefix: Tensor,
    prefix_row: Tensor,
    prefix_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[Any, Tensor]:
    """Forward rows whose first ``prefix[i]`` tokens are shared, each prefix once; ``(output, suffix_start)``.

    Args:
      model: a transformers model (a causal LM or its backbone) that
        :func:`prefix_sharing_unsupported` accepts.
      input_ids: ``[f, W]`` the rows' token ids, right-padded; on the model's device.
      lengths: ``[f]`` real tokens of each row (CPU).
      prefix: ``[f]`` tokens of each row computed by the prefix call (CPU); rows with the same
        ``prefix_row`` must have the same prefix length and the same first ``prefix`` ids (the
        caller checks it on the ids). A row's suffix must hold at least one token.
      prefix_row: ``[f]`` which prefix-call row (``0..p-1``) holds each row's prefix (CPU).
      prefix_kwargs: extra arguments of the prefix call (e.g. ``logits_to_keep=1``).
      kwargs: extra arguments of the suffix call.

    Returns:
      The suffix call's output, whose position ``s`` of row ``i`` is position
      ``suffix_start[i] + s`` of the whole row, and ``suffix_start`` (``= prefix``).
    """
    recording_layer, shared_layer = _cache_classes()
    from transformers.cache_utils import Cache

    device = input_ids.device
    f = input_ids.shape[0]
    num_prefixes = int(prefix_row.max()) + 1
    # the first row of each prefix gives its ids
    source = torch.full((num_prefixes,), f, dtype=torch.long).scatter_reduce(0, prefix_row, torch.arange(f), "amin")
    prefix_len = prefix[source]
    width = max(int(prefix_len.max()), 1)
    cols = torch.arange(width)
    # a prefix of 0 tokens still forwards one (masked out of the suffix call), so that no call row is all padding
    call_mask = (cols[None, :] < prefix_len.clamp_min(1)[:, None]).long()
    recorder = Cache(layers=[recording_layer() for _ in range(_num_layers(model))])
    name = cache_argument(model)
    with cache_allowed_under_checkpointing(model):
        prefix_out = model(input_ids=input_ids[source.to(device), :width], attention_mask=call_mask.to(device),
              position_ids=(call_mask.cumsum(1) - 1).clamp_min(0).to(device), use_cache=True,
              **{name: recorder}, **(prefix_kwargs or {}))
        rows = prefix_row.to(device)
        shared = Cache(layers=[shared_layer(layer.keys[rows], layer.values[rows]) for layer in recorder.layers])
        suffix_len = lengths - prefix
        if bool((suffix_len < 1).any()):
            raise ValueError("every row needs at least one token after its shared prefix")
        s_width = int(suffix_len.max())
        s_cols = torch.arange(s_width)
        gather = (prefix[:, None] + s_cols[None, :]).clamp(max=input_ids.shape[1] - 1)
        suffix_ids = input_ids.gather(1, gather.to(device))
        prefix_view = (cols[None, :] < prefix_len[:, None]).long()[prefix_row]
        suffix_mask = (s_cols[None, :] < suffix_len[:, None]).long()
        out = model(input_ids=suffix_ids, attention_mask=torch.cat([prefix_view, suffix_mask], 1).to(device),
                    position_ids=(prefix[:, None] + s_cols[None, :]).to(device), use_cache=True,
                    **{name: shared}, **kwargs)
    # FSDP gathers a layer's parameters for the backward pass when the gradient reaches the layer's
    # output; the prefix call's last layer gets its gradient through its keys and values only, so
    # an exact 0 that depends on the prefix call's output makes the gradient reach it there too (one
    # element: a sum could overflow in half precision, and 0 * inf is not 0)
    first = next(iter(out.keys()))
    out[first] = out[first] + 0.0 * prefix_out[next(iter(prefix_out.keys()))].flatten()[0]
    return out, prefix
