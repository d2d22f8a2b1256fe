"""One model call per scoring pass, for any tree of shared prefixes: the rows of a pass packed into one row.

A scoring pass (:mod:`seeupo.llm.policy`) forwards some rows of a batch. With ``scoring="packed"``
each forwarded row is a trajectory's longest row; with ``"prefix_shared"`` the rows of one group
(one task's rollouts) also share their first ``prefix`` tokens (the prompt). This module lays such
a pass out as **one packed row without padding**::

    [ group 0's prefix | row a's rest | row b's rest | group 1's prefix | row c's rest | ... ]

and runs the model once over it, with an attention rule that makes every token see exactly what it
sees in its own row: a token attends to the earlier tokens of its own *branch* (a row's rest) and to
its group's prefix, and to nothing else (:func:`tree_allows`). Position ids are the positions the
tokens have in their own rows, so rotary embeddings are those of the row. With causal attention
the hidden states of a prefix do not depend on what follows it, so every token of every row
computes what it computes in the row forwarded alone, gradients included: the per-row layout's
numbers up to floating-point summation order (the tests bound it). ``"packed"`` is the special
case of groups with an empty prefix and one branch each (a document mask).

How the rule reaches the model: transformers' decoder models take a 4-D ``attention_mask`` as a
mask already prepared (``masking_utils`` returns it as is, for every model family) and hand it to
the attention function; the pass gives :func:`prepared_mask`, an empty 4-D tensor that carries the
:class:`TreeMask` as an attribute. (A mapping ``{"full_attention": TreeMask}``, transformers' other
way in, is not taken by every family: Llama's model under transformers 5.24 builds its mask from
it and fails.) Activation checkpointing keeps that tensor with the layer's inputs, so the
recomputation sees the same rule. :func:`enable_tree_attention` registers an
attention function under its own name (``seeupo_tree_<base>``, e.g. ``seeupo_tree_sdpa``) that
computes the tree rule for a :class:`TreeMask` and calls the model's own attention function
(``sdpa``, ``eager``) for anything else, so generation and per-row scoring are unchanged, and
sets the model's configuration to it. It checks the model honours the rule with a
3-token probe before it is used, and reports why not otherwise (the caller then pads rows).

Three kernels compute the rule:

* ``flex``: one ``torch.nn.attention.flex_attention`` call (compiled, with a ``BlockMask`` built by
  ``create_block_mask``: only the blocks the rule allows are computed, no ``[N, N]`` mask exists).
  CUDA only here: on the CPU, flex attention has no backward pass (torch 2.13: "FlexAttention does
  not support backward on CPU").
* ``segments``: one ``scaled_dot_product_attention`` call per segment (a group's prefix with
  ``is_causal``; a branch's queries against its group's prefix and its own keys, causal aligned
  to the lower right: ``torch.nn.attention.bias.causal_lower_right``, which runs flash attention
  on CUDA in bf16/fp16, memory-efficient attention in float32 there, and a materialised
  ``[rest, prefix + rest]`` mask elsewhere). Any device, any dtype,
  float64 included: the reference the other kernels are tested against.
* ``cascade``: per group, the prefix causally, then all its branches' queries against the prefix
  in one call and each branch causally over itself, the two parts merged by their log-sum-exps
  (:func:`cascade_attention`; the backward pass runs each part's kernel backward with the merged
  output and log-sum-exp, flash attention's split-key rule). torch's flash kernel on CUDA, its CPU
  counterpart elsewhere; no copy of the prefix per branch. Any device; exact against
  ``segments`` in float64 (tested). The CPU's kernel (14-17% faster steps than ``segments`` at a
  tiny-model shape); on CUDA not chosen until a GPU measurement shows it faster than flex
  (``benchmarks/flex_options.py``, ``gpu_step.py --arms cascade``).

Where there is no tree (a pass of one row with no prefix) the segment kernel is plain causal sdpa.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.nn.attention.bias import causal_lower_right

from seeupo.llm.memory import checkpointed_attention

Tensor = torch.Tensor

TreeKernel = Literal["flex", "segments", "cascade"]
TREE_KERNELS: tuple[TreeKernel, ...] = ("flex", "segments", "cascade")

# flex attention computes in blocks of this many queries and keys; a packed row is padded to a
# multiple of it on the flex kernel so that the compiled kernel sees few distinct shapes
FLEX_BLOCK = 128


@dataclass(frozen=True)
class Segment:
    """Queries ``[start, end)`` of the packed row; they attend to ``[prefix_start, prefix_start + prefix_len)``
    (their group's prefix; ``prefix_len`` 0 for none) and causally to their own ``[start, end)``."""

    start: int
    end: int
    prefix_start: int = 0
    prefix_len: int = 0


@dataclass
class TreeMask:
    """The attention rule of one packed row (see the module docstring), for every layer of one call.

    ``segments`` tile ``[0, length)`` in order. ``group[i]`` and ``branch[i]`` (``[length]`` on the
    model's device) name token ``i``'s group and branch (``-1``: a prefix token, seen by every
    branch of its group). ``kernel`` says which kernel computes it; ``tokens``: the real tokens
    (the first ``tokens`` of the row; the rest is the flex kernel's padding).
    """

    segments: list[Segment]
    group: Tensor
    branch: Tensor
    kernel: TreeKernel = "segments"
    tokens: int = 0
    _block_mask: Any = field(default=None, repr=False)

    @property
    def length(self) -> int:
        return int(self.group.numel())

    def block_mask(self) -> Any:
        """The flex ``BlockMask`` of the rule (built on first use, shared by every layer of the call)."""
        if self._block_mask is None:
            from torch.nn.attention.flex_attention import create_block_mask

            group, branch = self.group, self.branch

            def allowed(b, h, q, k):
                return tree_allows(q, k, group, branch)

            n = self.length
            # compiled on CUDA: the eager version materialises the [n, n] mask it summarises
            make = _compiled_block_mask() if group.device.type == "cuda" else create_block_mask
            self._block_mask = make(allowed, None, None, n, n, device=group.device, BLOCK_SIZE=FLEX_BLOCK)
        return self._block_mask


def tree_allows(q: Tensor, k: Tensor, group: Tensor, branch: Tensor) -> Tensor:
    """Whether query ``q`` may attend to key ``k`` (packed indices): causal, same group, and ``k`` is a
    prefix token or in ``q``'s own branch."""
    return (k <= q) & (group[q] == group[k]) & ((branch[k] < 0) | (branch[k] == branch[q]))


@dataclass(frozen=True)
class PackedPass:
    """One pass's rows packed into one row (:func:`pack_tree`).

    ``input_ids``/``position_ids``: ``[1, length]``; ``index[i, j]``: where position ``j`` of
    forwarded row ``i`` sits in the packed row (``-1`` past the row's end); ``mask``: the rule.
    """

    input_ids: Tensor
    position_ids: Tensor
    index: Tensor
    mask: TreeMask


def prepared_mask(mask: TreeMask) -> Tensor:
    """``mask`` as the ``attention_mask`` of a model call: an empty ``[1, 1, 0, 0]`` tensor (a 4-D
    mask, passed through untouched) that carries the rule (:func:`tree_of` reads it back). Boolean,
    so that FSDP2's mixed precision, which casts floating-point inputs into new tensors, keeps it."""
    carrier = torch.empty(1, 1, 0, 0, dtype=torch.bool, device=mask.group.device)
    carrier.seeupo_tree = mask
    return carrier


def tree_of(attention_mask: Any) -> TreeMask | None:
    """The :class:`TreeMask` an attention call's ``attention_mask`` carries (:func:`prepared_mask`), else ``None``."""
    tree = getattr(attention_mask, "seeupo_tree", None) if isinstance(attention_mask, Tensor) else None
    return tree if isinstance(tree, TreeMask) else None


def call_tokens(input_ids: Tensor, attention_mask: Any) -> tuple[int, int]:
    """``(real, computed)`` tokens of one model call: a packed row's real tokens under a tree mask,
    the mask's ones of the computed positions under a 2-D mask (a key/value cache's positions
    excluded), all positions without one; ``computed`` counts padding too (what a dense kernel does)."""
    computed = int(input_ids.shape[0]) * int(input_ids.shape[1])
    tree = tree_of(attention_mask)
    if tree is not None:
        return tree.tokens, computed
    if isinstance(attention_mask, Tensor) and attention_mask.dim() == 2:
        return int(attention_mask[:, -input_ids.shape[1]:].sum()), computed
    return computed, computed


def attention_pairs(input_ids: Tensor, attention_mask: Any) -> int:
    """The (query, key) pairs one model call's causal attention computes on real tokens (for model FLOPs):
    under a tree mask each segment's queries against its prefix and its own earlier tokens; under a
    2-D mask (right-padded rows) or none, ``L (L + 1) / 2`` per row of ``L`` real tokens."""
    tree = tree_of(attention_mask)
    if tree is not None:
        return sum((s.end - s.start) * s.prefix_len + (s.end - s.start) * (s.end - s.start + 1) // 2
                   for s in tree.segments if s.start < tree.tokens)
    if isinstance(attention_mask, Tensor) and attention_mask.dim() == 2:
        lengths = attention_mask.sum(1).to(torch.int64)
    else:
        lengths = torch.full((input_ids.shape[0],), input_ids.shape[1], dtype=torch.int64)
    return int((lengths * (lengths + 1) // 2).sum())


def pack_tree(
    input_ids: Tensor, lengths: Tensor, prefix: Tensor, prefix_row: Tensor, kernel: TreeKernel = "segments",
    pad_id: int = 0,
) -> PackedPass:
    """Lay out the forwarded rows of a pass as one packed row (module docstring).

    Args:
      input_ids: ``[f, W]`` the rows' token ids, right-padded (any device; the result is on it).
      lengths: ``[f]`` real tokens per row.
      prefix: ``[f]`` tokens of each row that its group shares (0: none). Rows of one group must
        have the same prefix length and the same first ``prefix`` ids (the caller checks the ids)
        and at least one token after it.
      prefix_row: ``[f]`` each row's group (``0..g-1``); rows with no shared prefix may each be
        their own group.
      kernel: ``"flex"`` pads the packed row to a multiple of :data:`FLEX_BLOCK` (pad tokens form
        their own group and are read by nothing).
      pad_id: the id of pad tokens.
    """
    if kernel not in TREE_KERNELS:
        raise ValueError(f"unknown tree kernel {kernel!r}; expected one of {TREE_KERNELS}")
    lengths, prefix, prefix_row = lengths.cpu().tolist(), prefix.cpu().tolist(), prefix_row.cpu().tolist()
    f, W = input_ids.shape
    members: dict[int, list[int]] = {}
    for i, g in enumerate(prefix_row):
        members.setdefault(g, []).append(i)
    ids_parts: list[Tensor] = []
    pos_parts: list[Tensor] = []
    group_parts: list[Tensor] = []
    branch_parts: list[Tensor] = []
    segments: list[Segment] = []
    index = torch.full((f, W), -1, dtype=torch.long)
    at = 0

    def put(row: int, lo: int, hi: int, g: int, b: int) -> None:
        nonlocal at
        ids_parts.append(input_ids[row, lo:hi])
        pos_parts.append(torch.arange(lo, hi))
        group_parts.append(torch.full((hi - lo,), g, dtype=torch.long))
        branch_parts.append(torch.full((hi - lo,), b, dtype=torch.long))
        at += hi - lo

    for g, rows in enumerate(members.values()):
        p = prefix[rows[0]]
        if any(prefix[i] != p for i in rows):
            raise ValueError("the rows of one group must share one prefix length")
        prefix_start = at
        if p > 0:
            segments.append(Segment(at, at + p))
            put(rows[0], 0, p, g, -1)
            for i in rows:
                index[i, :p] = torch.arange(prefix_start, prefix_start + p)
        for i in rows:
            if lengths[i] <= p:
                raise ValueError("every row needs at least one token after its shared prefix")
            segments.append(Segment(at, at + lengths[i] - p, prefix_start, p))
            index[i, p : lengths[i]] = torch.arange(at, at + lengths[i] - p)
            put(i, p, lengths[i], g, i)
    tokens = at
    if kernel == "flex" and at % FLEX_BLOCK:
        pad = FLEX_BLOCK - at % FLEX_BLOCK
        segments.append(Segment(at, at + pad))
        ids_parts.append(torch.full((pad,), pad_id, dtype=input_ids.dtype, device=input_ids.device))
        pos_parts.append(torch.zeros(pad, dtype=torch.long))
        group_parts.append(torch.full((pad,), len(members), dtype=torch.long))
        branch_parts.append(torch.full((pad,), -1, dtype=torch.long))
    device = input_ids.device
    mask = TreeMask(segments, torch.cat(group_parts).to(device), torch.cat(branch_parts).to(device), kernel, tokens)
    return PackedPass(torch.cat(ids_parts)[None], torch.cat(pos_parts)[None].to(device), index.to(device), mask)


def segment_attention(query: Tensor, key: Tensor, value: Tensor, mask: TreeMask, scale: float | None) -> Tensor:
    """The rule of ``mask`` by one sdpa call per segment: ``[1, H, N, D]`` like ``query``."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gqa = query.shape[1] != key.shape[1]
    outs = []
    for s in mask.segments:
        q = query[:, :, s.start : s.end]
        k, v = key[:, :, s.start : s.end], value[:, :, s.start : s.end]
        if s.prefix_len == 0:
            outs.append(sdpa(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa))
            continue
        lo, hi = s.prefix_start, s.prefix_start + s.prefix_len
        k = torch.cat([key[:, :, lo:hi], k], dim=2)
        v = torch.cat([value[:, :, lo:hi], v], dim=2)
        if gqa and query.is_cuda:  # the lower-right causal flash path takes equal head counts
            k, v = (t.repeat_interleave(query.shape[1] // t.shape[1], dim=1) for t in (k, v))
        # query i of the branch sees the whole prefix and the branch up to itself: causal aligned to
        # the lower right (flash attention's own rule on CUDA in half precision; a mask elsewhere)
        n = s.end - s.start
        rule = causal_lower_right(n, s.prefix_len + n)
        outs.append(sdpa(q, k, v, attn_mask=rule, scale=scale, enable_gqa=gqa and not query.is_cuda))
    return torch.cat(outs, dim=2)


@functools.cache
def _compiled_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # dynamic: the packed row's length changes from pass to pass; one compilation serves them all
    return torch.compile(flex_attention, dynamic=True)


def flex_tree_attention(query: Tensor, key: Tensor, value: Tensor, mask: TreeMask, scale: float | None) -> Tensor:
    """The rule of ``mask`` by one compiled flex attention call: ``[1, H, N, D]`` like ``query``."""
    return _compiled_flex()(query, key, value, block_mask=mask.block_mask(), scale=scale,
                            enable_gqa=query.shape[1] != key.shape[1])


# --- the cascade kernel: a group's prefix attended once for all its branches -------------------


def _attend(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor, tuple]:
    """``(out, lse, extras)`` of softmax attention: ``lse`` the float32 (or wider) natural
    log-sum-exp of each query's scores ``[B, H, Lq]``; ``extras`` what the kernel's backward pass
    takes besides (sequence bookkeeping and random state on CUDA). torch's flash kernel on CUDA,
    its CPU counterpart elsewhere; causal aligned to the top left (queries and keys of equal length
    here). No autograd."""
    if q.is_cuda:
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=scale)
        return out, lse, (cum_q, cum_k, max_q, max_k, seed, offset)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out, lse, ()


def _attend_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, extras: tuple,
                     causal: bool, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of :func:`_attend` given the output ``out`` and log-sum-exp ``lse`` of the
    *whole* attention ``q`` takes part in: with them the kernel's backward pass gives the exact
    share of ``k``/``v``'s part (``P = exp(S - lse)``, ``D = rowsum(grad * out)``), so the parts'
    ``dq`` sum to the whole's (flash attention's split-key backward)."""
    if q.is_cuda:
        cum_q, cum_k, max_q, max_k, seed, offset = extras
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset, scale=scale)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, out, lse, 0.0, causal,
                                                                               scale=scale)


class _PrefixAndBranches(torch.autograd.Function):
    """The queries of a group's branches (``[B, H, R, D]``, the branches one after another, of
    ``lengths``) attend to the group's prefix (``k_prefix``, ``v_prefix``: every branch query sees
    all of it) and causally to their own branch (``k_rest``, ``v_rest``, aligned with the queries):
    two kernel calls per group instead of one per branch over a copied ``[prefix; branch]``,
    merged by their log-sum-exps; the backward pass runs each part's kernel backward with the
    merged output and log-sum-exp (:func:`_attend_backward`)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k_prefix: Tensor, v_prefix: Tensor, k_rest: Tensor, v_rest: Tensor,
                lengths: list[int], scale: float) -> Tensor:
        on_prefix, lse_prefix, prefix_extras = _attend(q, k_prefix, v_prefix, False, scale)
        spans = _spans(lengths)
        parts = [_attend(q[:, :, lo:hi], k_rest[:, :, lo:hi], v_rest[:, :, lo:hi], True, scale) for lo, hi in spans]
        on_branch = torch.cat([part[0] for part in parts], dim=2)
        lse_branch = torch.cat([part[1] for part in parts], dim=2)
        lse = torch.logaddexp(lse_prefix, lse_branch)
        # each part's softmax is over its own keys: weigh it by its share of the whole's mass
        out = (on_prefix.to(lse.dtype) * torch.exp(lse_prefix - lse)[..., None]
               + on_branch.to(lse.dtype) * torch.exp(lse_branch - lse)[..., None]).to(q.dtype)
        ctx.save_for_backward(q, k_prefix, v_prefix, k_rest, v_rest, out, lse)
        ctx.spans, ctx.scale = spans, scale
        ctx.extras = [prefix_extras] + [part[2] for part in parts]
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k_prefix, v_prefix, k_rest, v_rest, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dk_prefix, dv_prefix = _attend_backward(grad, q, k_prefix, v_prefix, out, lse, ctx.extras[0], False, ctx.scale)
        parts = [_attend_backward(*(t[:, :, lo:hi].contiguous() for t in (grad, q, k_rest, v_rest, out, lse)), extras, True,
                                  ctx.scale)
                 for (lo, hi), extras in zip(ctx.spans, ctx.extras[1:])]
        dq = dq + torch.cat([p[0] for p in parts], dim=2)
        return (dq, dk_prefix, dv_prefix, torch.cat([p[1] for p in parts], dim=2), torch.cat([p[2] for p in parts], dim=2),
                None, None)


def _spans(lengths: list[int]) -> list[tuple[int, int]]:
    return [(end - n, end) for n, end in zip(lengths, itertools.accumulate(lengths))]


def cascade_attention(query: Tensor, key: Tensor, value: Tensor, mask: TreeMask, scale: float | None) -> Tensor:
    """The rule of ``mask`` with each group's prefix attended once for all its branches: per group,
    the prefix causally, then the branches against the prefix (one call) and each branch causally
    (:class:`_PrefixAndBranches`); a segment with no prefix causally by itself. ``[1, H, N, D]``
    like ``query``; the same numbers as :func:`segment_attention` up to summation order (tested)."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if query.shape[1] != key.shape[1]:  # the kernels take as many key-value heads as query heads
        key, value = (t.repeat_interleave(query.shape[1] // t.shape[1], dim=1) for t in (key, value))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    outs, i, segments = [], 0, mask.segments
    while i < len(segments):
        s = segments[i]
        j = i + 1
        if s.prefix_len == 0:
            # a group's prefix (its branches follow it) or a row of its own
            outs.append(sdpa(query[:, :, s.start:s.end], key[:, :, s.start:s.end], value[:, :, s.start:s.end],
                             is_causal=True, scale=scale))
            i = j
            continue
        while j < len(segments) and segments[j].prefix_start == s.prefix_start and segments[j].prefix_len == s.prefix_len:
            j += 1
        lo, hi, start, end = s.prefix_start, s.prefix_start + s.prefix_len, s.start, segments[j - 1].end
        outs.append(_PrefixAndBranches.apply(
            query[:, :, start:end].contiguous(), key[:, :, lo:hi].contiguous(), value[:, :, lo:hi].contiguous(),
            key[:, :, start:end].contiguous(), value[:, :, start:end].contiguous(),
            [t.end - t.start for t in segments[i:j]], scale))
        i = j
    return torch.cat(outs, dim=2)


def tree_attention(query: Tensor, key: Tensor, value: Tensor, mask: TreeMask, scale: float | None) -> Tensor:
    """``[1, H, N, D]``: attention of the packed row under ``mask``'s rule, by its kernel."""
    if mask.kernel == "flex":
        return flex_tree_attention(query, key, value, mask, scale)
    if mask.kernel == "cascade":
        return cascade_attention(query, key, value, mask, scale)
    return segment_attention(query, key, value, mask, scale)


def default_kernel(device: torch.device) -> TreeKernel:
    """``"flex"`` on CUDA (where flex attention has a backward pass), ``"cascade"`` elsewhere (on
    the CPU 14-17% faster steps than ``"segments"`` at a tiny-model shape: benchmarks/RESULTS.md)."""
    if device.type != "cuda":
        return "cascade"
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return "segments"
    return "flex"


# --- the model side ---------------------------------------------------------------------------

_PREFIX = "seeupo_tree_"


def _register(base: str) -> str:
    """Register (once) the attention function and mask function named ``seeupo_tree_<base>``."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = _PREFIX + base
    if name in ALL_ATTENTION_FUNCTIONS:
        return name
    if base == "eager":
        from transformers.models.llama.modeling_llama import eager_attention_forward as base_fn
    else:
        base_fn = ALL_ATTENTION_FUNCTIONS[base]

    def attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any,
                  scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
        tree = tree_of(attention_mask)
        if tree is None:
            return checkpointed_attention(
                lambda: base_fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs))
        if dropout > 0:
            raise ValueError("tree attention computes without dropout; keep the model's attention dropout at 0")
        out = checkpointed_attention(lambda: tree_attention(query, key, value, tree, scaling))
        return out.transpose(1, 2).contiguous(), None

    ALL_ATTENTION_FUNCTIONS.register(name, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


def base_attention(config: Any) -> str | None:
    """The attention implementation ``config`` names, as transformers knows it: ``"sdpa"`` for
    ``"seeupo_tree_sdpa"`` (tree attention passes every other call to it unchanged)."""
    name = getattr(config, "_attn_implementation", None)
    return name.removeprefix(_PREFIX) if isinstance(name, str) else name


def enable_tree_attention(model: torch.nn.Module) -> str | None:
    """Make ``model`` (a transformers model or backbone) compute :class:`TreeMask` passes; ``None`` if it
    can, else a one-line reason why not (the model is then left as it was).

    Needs a transformers model whose layers all use full attention through an attention function
    of the registry (``sdpa`` or ``eager``) and that passes a prepared 4-D mask through to it;
    checked by a 3-token probe: ``[a | b, c]`` (prefix ``a``, branches ``b`` and ``c``) must give at
    ``c`` the hidden state of the row ``a, c`` forwarded alone. Idempotent: the answer is kept on
    the model (its configuration names the tree function; a reason in ``_seeupo_no_tree``), so a
    copy of the model keeps it too.
    """
    from seeupo.llm.models import keeps_every_key

    config = getattr(model, "config", None)
    # a copy of an enabled model whose layers were changed since is checked again
    if str(getattr(config, "_attn_implementation", None)).startswith(_PREFIX) and keeps_every_key(config):
        return None
    reason = getattr(model, "_seeupo_no_tree", None)
    if reason is None:
        reason = _enable(model)
        if reason is not None:
            object.__setattr__(model, "_seeupo_no_tree", reason)
    return reason


def _enable(model: torch.nn.Module) -> str | None:
    from seeupo.llm.models import keeps_every_key

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return f"{type(model).__name__} is not a transformers model"
    if not keeps_every_key(config):
        return "not all its layers are full attention (sliding-window or linear-attention layers)"
    base = config._attn_implementation or "eager"
    if base.startswith(_PREFIX):
        return None
    if base not in ("sdpa", "eager"):
        return f"its attention implementation {base!r} is not sdpa or eager"
    config._attn_implementation = _register(base)
    reason = _probe(model)
    if reason is not None:
        config._attn_implementation = base
    return reason


def _probe(model: torch.nn.Module) -> str | None:
    """Check on 3 tokens that ``model`` computes the tree rule (see :func:`enable_tree_attention`)."""
    param = next(model.parameters())
    device = param.device
    ids = torch.tensor([[5, 6, 7]], device=device)
    packed = pack_tree(ids.new_tensor([[5, 6, 0], [5, 7, 0]]), torch.tensor([2, 2]), torch.tensor([1, 1]),
                       torch.tensor([0, 0]), "segments")
    try:
        with torch.no_grad():
            tree = _last_hidden(model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                                      attention_mask=prepared_mask(packed.mask), use_cache=False))
            alone = _last_hidden(model(input_ids=ids[:, [0, 2]], position_ids=torch.tensor([[0, 1]], device=device),
                                       use_cache=False))
    except Exception as error:  # a model that does not take a prepared 4-D mask fails here
        return f"it does not take a prepared attention mask ({type(error).__name__}: {str(error)[:120]})"
    finally:
        # FSDP2 keeps the root's parameters gathered after a forward (for the backward that usually
        # follows): shard them again, so that an optimizer built next holds the sharded parameters
        for module in model.modules():
            if type(module).__name__.startswith("FSDP") and callable(getattr(module, "reshard", None)):
                module.reshard()
    a, b = tree[0, 2].float(), alone[0, 1].float()
    tolerance = 1e-3 if param.dtype in (torch.float32, torch.float64) else 5e-2
    if not torch.allclose(a, b, rtol=tolerance, atol=tolerance * float(b.abs().max().clamp_min(1e-6))):
        return "it ignores a prepared attention mask (the 3-token probe differs from the row forwarded alone)"
    return None


def _last_hidden(output: Any) -> Tensor:
    value = getattr(output, "last_hidden_state", None)
    return output.logits if value is None else value
