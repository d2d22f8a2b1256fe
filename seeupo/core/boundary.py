"""The boundary between the core and the registered functions: every call is checked.

Each registered piece of an algorithm (advantage estimator, policy loss, aggregation, turn
order, ``M`` factor; :mod:`seeupo.core.registry`) is called through one function here, on every
call, in the exact and sampled tabular modes and in the language-model trainer. The built-in
entries go through the same checks. Each call checks what the core relies on:

* the result's type (a ``torch.Tensor``, not a list, ``None`` or a number), shape, dtype
  (floating where the core does arithmetic with it, bool for the clip mask) and device;
* finite values at the valid positions (real tokens of valid rows; padding may hold anything),
  unless the function's own inputs there were not finite (NaN rewards from a broken environment
  are not the estimator's fault: the update skips such steps and the trainer stops after
  ``optim.max_non_finite`` of them) or, for a loss, a ratio may have overflowed;
* a policy loss's objective requires grad when ``logp_new`` does (else the step would be silently
  empty);
* the inputs left unchanged: the batch's tensors (``data``'s included), the advantages given to a
  loss, an aggregation's and an ``M`` factor's inputs keep their identity, their version counter
  and their content. Torch bumps a tensor's ``_version`` on every in-place operation
  (``batch.reward[0] = 1``, ``batch.traj_return.mul_(2)``, a write through ``.detach()``, which
  shares the counter); a write through ``.numpy()``, ``.data``, DLPack or a raw pointer bumps
  nothing, so each tensor's bytes are also copied before the call and compared after it (on the
  CPU a ``bytes`` copy and a memcmp; on an accelerator a clone, compared on the device with one
  synchronisation for all of them). The comparison is of bits, not values: a NaN equals itself,
  ``-0.0`` differs from ``0.0``. The message names each changed tensor and says when torch's
  counter missed the write. Not seen: a write that puts back the bytes it found (nothing changed),
  a write after the call returns (through a view the function kept), the function's other inputs
  (``logp_new``, ``cfg``, ``critic_values``, ``oracle``, ``group_stats``) and the content of
  sparse or meta tensors (their identity and version still are). The cost is a copy of the inputs'
  bytes before the call and a copy and a memcmp after it, plus a few microseconds a tensor
  (``benchmarks/plugin_boundary.py``).

A violation raises :class:`PluginError`, one line (the command line prints it and exits with 2)::

    advantage estimator 'nan_adv' (my_est.py:6) returned non-finite values at 48 of 48 valid tokens
    (first: row 0, token 0 = nan); expected finite advantages

If the function itself raises, the line names the function and the exception and keeps only the
user's own frames (``... raised ZeroDivisionError: division by zero (at my_est.py:9 in nan_adv)``);
an exception of a built-in is a toolkit bug and keeps its traceback. The error pickles, so the
same line reaches the parent from a worker process. The cost is measured by
``benchmarks/plugin_boundary.py`` (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import operator
import os
import sys
import traceback
from typing import Any, Callable, NamedTuple, Sequence

import torch

from seeupo.core.batch import SampleBatch, segment_sum
from seeupo.core.registry import (AdvantageEstimator, Aggregation, Entry, KlEstimator, MFactor, PolicyLoss,
                                  RolloutCorrection, TurnOrder, shown_path)
from seeupo.validation.errors import InputError

Tensor = torch.Tensor

_KIND = {AdvantageEstimator: "advantage estimator", PolicyLoss: "policy loss", Aggregation: "loss aggregation",
         TurnOrder: "turn order", MFactor: "M factor"}
# frames of these folders are not the user's: the toolkit, the standard library, installed packages
_NOT_USER = tuple({os.path.dirname(os.path.abspath(__file__)).rsplit(os.sep, 1)[0] + os.sep,
                   os.path.join(sys.base_prefix, ""), os.path.join(sys.prefix, ""), os.path.join(sys.exec_prefix, "")})
# a policy loss is blamed for a non-finite objective only while every trajectory's sum of |log pi - log pi_old|
# stays below this: beyond it exp() of a (sequence) ratio may overflow, which is the policy's drift, not the loss's bug
_RATIO_LOG_LIMIT = 20.0


class PluginError(InputError):
    """A registered function broke its contract; ``str(err)`` is one line naming the function, the file and
    line where it was registered, what was expected and what came back."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # a worker process sends it to its parent
        return type(self), (self.message,)


def label(entry: Entry) -> str:
    """``advantage estimator 'name' (FILE:LINE)``: how messages name a registered function."""
    return f"{_KIND.get(type(entry), 'registered function')} {entry.name!r} ({entry.where})"


# ---------------------------------------------------------------------------------------------- the calls


def call_estimator(
    entry: AdvantageEstimator, batch: SampleBatch, cfg: Any, *, critic_values: Tensor | None = None,
    oracle: Tensor | None = None, group_stats: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """``entry.fn(batch, cfg, critic_values=..., oracle=..., group_stats=...)``, checked: ``[n, L]`` floating
    advantages on the batch's device, finite on valid tokens, the batch unchanged."""
    before = _snapshot(_inputs(batch))
    adv = _call(entry, batch, cfg, critic_values=critic_values, oracle=oracle, group_stats=group_stats)
    _unchanged(entry, before, _inputs(batch))
    _tensor(entry, "advantages", adv, tuple(batch.logp_old.shape), "[n, L] = " + _shape(batch.logp_old),
            batch.logp_old.device)
    valid = lambda: batch.token_mask & batch.valid[:, None]  # noqa: E731

    def inputs_not_finite() -> bool:  # then the estimator is not to blame (a broken reward: the update skips the step)
        given = [batch.traj_return[batch.valid], batch.reward[batch.valid]]
        given += [x[valid()] for x in (critic_values, oracle) if isinstance(x, torch.Tensor) and x.shape == adv.shape]
        return not all(bool(torch.isfinite(x).all()) for x in given)

    _finite(entry, "advantages", adv, valid, excused=inputs_not_finite)
    return adv


def call_policy_loss(entry: PolicyLoss, logp_new: Tensor, batch: SampleBatch, adv: Tensor, cfg: Any) -> tuple[Tensor, Tensor | None]:
    """``entry.fn(logp_new, batch, adv, cfg)``, checked: ``(objective, clipped)`` with a floating ``[n, L]``
    objective that requires grad when ``logp_new`` does and is finite on valid tokens whose inputs are finite,
    ``clipped`` ``None`` or a bool ``[n, L]``; the batch and ``adv`` unchanged."""
    before = _snapshot(_inputs(batch, adv=adv))
    out = _call(entry, logp_new, batch, adv, cfg)
    _unchanged(entry, before, _inputs(batch, adv=adv))
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        _fail(entry, "(objective [n, L], clipped [n, L] bool or None)", _describe(out))
    objective, clipped = out
    shape = tuple(logp_new.shape)
    _tensor(entry, "objective", objective, shape, "[n, L] = " + _shape(logp_new), logp_new.device)
    if logp_new.requires_grad and torch.is_grad_enabled() and not objective.requires_grad:
        _fail(entry, "an objective that requires grad (logp_new does; the update differentiates it)",
              "an objective without grad (computed under no_grad, detached, or not from logp_new)")
    valid = lambda: batch.token_mask & batch.valid[:, None]  # noqa: E731

    def inputs_excuse() -> bool:  # non-finite inputs, or a ratio that may overflow: the loss is not to blame
        mask = valid()
        with torch.no_grad():
            log_ratio = torch.where(mask, logp_new.detach() - batch.logp_old.to(logp_new.dtype), 0.0)
            if not (bool(torch.isfinite(log_ratio).all()) and bool(torch.isfinite(adv[mask]).all())):
                return True
            per_traj = segment_sum(log_ratio.abs().sum(1).to(torch.float64), batch.traj_id, batch.num_trajectories)
            return bool((per_traj > _RATIO_LOG_LIMIT).any())

    _finite(entry, "objective", objective, valid, excused=inputs_excuse)
    if clipped is not None:
        _tensor(entry, "clipped", clipped, shape, "[n, L] = " + _shape(logp_new), logp_new.device, dtype="bool")
    return objective, clipped


def call_aggregation(entry: Aggregation, n_tokens: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """``entry.fn(n_tokens, weight)``, checked: ``(per_row, den_terms)``, floating ``[n]`` on the inputs'
    device, finite; the inputs unchanged."""
    before = _snapshot(_inputs(None, n_tokens=n_tokens, weight=weight))
    out = _call(entry, n_tokens, weight)
    _unchanged(entry, before, _inputs(None, n_tokens=n_tokens, weight=weight))
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        _fail(entry, "(per_row [n], den_terms [n])", _describe(out))
    for what, value in zip(("per_row", "den_terms"), out):
        _tensor(entry, what, value, tuple(n_tokens.shape), "[n] = " + _shape(n_tokens), n_tokens.device)
        _finite(entry, what, value, None, positions="rows")
    return out[0], out[1]


def call_kl_estimator(entry: KlEstimator, logp: Tensor, logp_ref: Tensor, valid: Tensor) -> Tensor:
    """``entry.fn(logp, logp_ref)``, checked: a floating ``[n, L]`` tensor on the inputs' device, finite on the
    ``valid`` tokens, the inputs unchanged."""
    before = _snapshot(_inputs(None, logp=logp, logp_ref=logp_ref))
    out = _call(entry, logp, logp_ref)
    _unchanged(entry, before, _inputs(None, logp=logp, logp_ref=logp_ref))
    _tensor(entry, "KL estimates", out, tuple(logp.shape), "[n, L] = " + _shape(logp), logp.device)
    if logp.requires_grad and torch.is_grad_enabled() and not out.requires_grad:
        _fail(entry, "KL estimates that require grad (logp does; a KL term in the loss differentiates them)",
              "estimates without grad (computed under no_grad, detached, or not from logp)")
    _finite(entry, "KL estimates", out, lambda: valid)
    return out


def call_rollout_correction(entry: RolloutCorrection, batch: SampleBatch, cfg: Any) -> Tensor:
    """``entry.fn(batch, cfg)``, checked: a floating ``[n, L]`` tensor on the batch's device without gradient,
    finite and ``>= 0`` on the valid tokens, the batch unchanged."""
    before = _snapshot(_inputs(batch))
    out = _call(entry, batch, cfg)
    _unchanged(entry, before, _inputs(batch))
    _tensor(entry, "correction weights", out, tuple(batch.logp_old.shape), "[n, L] = " + _shape(batch.logp_old),
            batch.logp_old.device)
    if out.requires_grad:
        _fail(entry, "weights without gradient (a correction reweights tokens; it is not trained)", "weights with grad")
    valid = batch.token_mask & batch.valid[:, None]
    _finite(entry, "correction weights", out, lambda: valid)
    negative = valid & (out < 0)
    if bool(negative.any()):
        _fail(entry, "weights >= 0 on valid tokens", f"{int(negative.sum())} negative (first {float(out[negative][0])})")
    return out


def call_turn_order(entry: TurnOrder, num_turns: int, cfg: Any, generator: torch.Generator | None) -> list[int]:
    """``entry.fn(num_turns, cfg, generator)``, checked: a permutation of ``0..num_turns-1`` (a list or tuple of
    ints, or a 1-D integer tensor)."""
    out = _call(entry, num_turns, cfg, generator)
    expected = f"a permutation of the turns 0..{num_turns - 1} (a list of ints)"
    if isinstance(out, torch.Tensor) and out.dim() == 1 and not out.is_floating_point() and out.dtype != torch.bool:
        out = out.tolist()
    if not isinstance(out, (list, tuple, range)):
        _fail(entry, expected, _describe(out))
    try:
        order = [operator.index(t) for t in out if not isinstance(t, bool)]
    except TypeError:
        order = []
    if len(order) != len(out) or sorted(order) != list(range(num_turns)):
        _fail(entry, expected, _short(list(out)))
    return order


def call_m_factor(entry: MFactor, factor: Tensor, ratio: Tensor, cfg: Any) -> Tensor:
    """``entry.fn(factor, ratio, cfg)``, checked: a floating tensor of ``factor``'s shape and device, finite
    where ``factor`` and ``ratio`` are; the inputs unchanged."""
    before = _snapshot(_inputs(None, factor=factor, ratio=ratio))
    out = _call(entry, factor, ratio, cfg)
    _unchanged(entry, before, _inputs(None, factor=factor, ratio=ratio))
    _tensor(entry, "factor", out, tuple(factor.shape), "[k] = " + _shape(factor), factor.device)
    _finite(entry, "factor", out, None, positions="trajectories",
            excused=lambda: not (bool(torch.isfinite(factor).all()) and bool(torch.isfinite(ratio).all())))
    return out


# ---------------------------------------------------------------------------------------------- checks


def _call(entry: Entry, *args: Any, **kwargs: Any) -> Any:
    """Call the function; an exception of a user's function becomes one line with the user's frames."""
    try:
        return entry.fn(*args, **kwargs)
    except PluginError:
        raise
    except Exception as err:
        if entry.builtin:  # the toolkit's own bug: keep the traceback
            raise
        at = user_frames(err, skip=1)
        text = " ".join(str(err).split())
        text = text if len(text) <= 300 else text[:297] + "..."
        raise PluginError(f"{label(entry)} raised {type(err).__name__}: {text}" + (f" (at {at})" if at else "")) from None


def user_frames(err: BaseException, skip: int = 0) -> str:
    """Where ``err`` passed through the user's own code: ``FILE:LINE in FUNC, ...`` (the last four frames
    outside the toolkit and Python's own library, frozen import machinery included; ``skip`` frames at the
    top left out), or ``""``."""
    frames = [f for f in traceback.extract_tb(err.__traceback__)[skip:]
              if not f.filename.startswith("<") and not os.path.abspath(f.filename).startswith(_NOT_USER)]
    return ", ".join(f"{shown_path(f.filename)}:{f.lineno} in {f.name}" for f in frames[-4:])


def _fail(entry: Entry, expected: str, got: str) -> None:
    raise PluginError(f"{label(entry)}: expected {expected}, got {got}")


def _tensor(entry: Entry, what: str, value: Any, shape: tuple[int, ...], shape_text: str, device: torch.device,
            dtype: str = "floating") -> None:
    if not isinstance(value, torch.Tensor):
        _fail(entry, f"{what} as a torch.Tensor {shape_text}", _describe(value))
    if tuple(value.shape) != shape:
        _fail(entry, f"{what} of shape {shape_text}", f"shape {_shape(value)}")
    if dtype == "floating" and not value.is_floating_point():
        _fail(entry, f"{what} of a floating dtype", f"dtype {value.dtype}")
    if dtype == "bool" and value.dtype != torch.bool:
        _fail(entry, f"{what} of dtype torch.bool", f"dtype {value.dtype}")
    if value.device != device:
        _fail(entry, f"{what} on {device}", f"a tensor on {value.device}")


def _finite(entry: Entry, what: str, value: Tensor, valid: Callable[[], Tensor] | None,
            excused: Callable[[], bool] = lambda: False, positions: str = "valid tokens") -> None:
    """Every ``value`` finite where ``valid()`` (``None``: everywhere), unless ``excused()`` (the inputs were not
    finite); both are computed only when the fast test fails."""
    value = value.detach()
    # fast path: a sum is finite exactly when no term is NaN or inf (or it overflowed: then the exact test
    # below finds nothing); a reduction is ~10x cheaper than isfinite().all() on the CPU. One device sync.
    if bool(torch.isfinite(value.sum())):
        return
    mask = valid() if valid is not None else torch.ones_like(value, dtype=torch.bool)
    bad = mask & ~torch.isfinite(value)  # padding may hold anything
    if bool(bad.any()) and not excused():
        where = bad.nonzero()[0].tolist()
        first = ", ".join(f"{k} {i}" for k, i in zip(("row", "token"), where))
        raise PluginError(f"{label(entry)} returned non-finite {what} at {int(bad.sum())} of {int(mask.sum())} "
                          f"{positions} (first: {first} = {float(value[tuple(where)])}); expected finite {what}")


def _inputs(batch: SampleBatch | None, **more: Tensor) -> list[tuple[str, Tensor]]:
    """The tensors a call must leave unchanged, named as messages name them: the batch's (``batch.reward``,
    ``batch.data['hist']``), then ``more`` (``adv``)."""
    out = []
    for name, value in (vars(batch).items() if batch is not None else ()):
        if isinstance(value, torch.Tensor):
            out.append((f"batch.{name}", value))
        elif isinstance(value, dict):
            out += [(f"batch.{name}[{k!r}]", v) for k, v in value.items() if isinstance(v, torch.Tensor)]
    return out + list(more.items())


class _Contents(NamedTuple):
    layout: list[tuple[str, Tensor, torch.dtype, torch.Size]]  # every tensor: (name, tensor, dtype, shape)
    host: list[tuple[str, Tensor, int]]  # CPU tensors with plain bytes: (name, tensor, number of bytes)
    joined: bytes  # their bytes, one after the other: one copy before the call and one memcmp after it
    device: list[tuple[str, Tensor, Tensor]]  # the others with plain bytes: (name, tensor, clone of _bits)


class _Snapshot(NamedTuple):
    versions: list[tuple[str, int, int]]  # (name, id, _version): a reassignment or an in-place op torch counts
    contents: _Contents  # any other write


def _snapshot(named: Sequence[tuple[str, Tensor]]) -> _Snapshot:
    return _Snapshot(_versions(named), _contents(named))


def _versions(named: Sequence[tuple[str, Tensor]]) -> list[tuple[str, int, int]]:
    return [(name, id(t), t._version) for name, t in named]


_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: Tensor) -> Tensor | None:
    """``t``'s elements as integers of the same width: compared bit for bit (NaN equals NaN, -0.0 differs from
    0.0), and numpy takes them (it has no bfloat16); ``None`` where there are no plain bytes to compare."""
    if t.layout != torch.strided or t.device.type == "meta":
        return None
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj().resolve_neg())
    return t.view(_INT[t.element_size()]) if t.element_size() in _INT else None


def _host_bytes(t: Tensor) -> Any:
    """A CPU tensor's bytes as a buffer that ``bytes.join`` takes (numpy's view of the memory, no copy, where it is
    contiguous); ``None`` off the CPU or without plain bytes. ``Tensor.numpy`` alone is tried first: one call where
    :func:`_bits` is several torch ops, ~2x the time, for each of a batch's ten tensors or more."""
    if not t.is_cpu:
        return None
    try:
        array = t.numpy()
    except (TypeError, RuntimeError):  # numpy refuses grad, conj views, bfloat16, float8, sparse
        bits = _bits(t)
        if bits is None:
            return None
        array = bits.numpy()
    return array if array.flags.c_contiguous else array.tobytes()


def _contents(named: Sequence[tuple[str, Tensor]]) -> _Contents:
    out = _Contents([], [], b"", [])
    parts = []
    for name, t in named:
        out.layout.append((name, t, t.dtype, t.shape))
        part = _host_bytes(t)
        if part is not None:
            parts.append(part)
            out.host.append((name, t, t.nbytes))  # as many as the part holds, copied or not
        elif not t.is_cpu and (bits := _bits(t)) is not None:
            out.device.append((name, t, bits.clone()))  # on the device: no copy to the host, no synchronisation
    return out._replace(joined=b"".join(parts))


def _rewritten(before: _Contents) -> set[str]:
    """The names whose tensor no longer holds what it held: CPU tensors by their bytes (each compared alone only
    when the joined bytes differ), the others on their device with one synchronisation for all of them."""
    changed = {name for name, t, dtype, shape in before.layout if t.dtype != dtype or t.shape != shape}
    parts = [_host_bytes(t) for _, t, _ in before.host]
    if any(part is None for part in parts) or b"".join(parts) != before.joined:
        start = 0
        for (name, _, size), part in zip(before.host, parts):
            if part is None or bytes(part) != before.joined[start:start + size]:
                changed.add(name)
            start += size
    changed |= {name for name, t, bits in before.device if t.device != bits.device}  # .data moved to another device
    flags = [(name, (_bits(t) != bits).any()) for name, t, bits in before.device if name not in changed]
    if flags:
        device = flags[0][1].device
        differs = torch.stack([flag.to(device) for _, flag in flags]).tolist()
        changed |= {name for (name, _), d in zip(flags, differs) if d}
    return changed


def _unchanged(entry: Entry, before: _Snapshot, after: Sequence[tuple[str, Tensor]]) -> None:
    now = _versions(after)
    counted = set()
    if before.versions != now:
        counted = {b[0] for b in before.versions} ^ {a[0] for a in now}
        counted |= {b[0] for b, a in zip(before.versions, now) if b != a}
    by_bytes = _rewritten(before.contents) - counted
    if counted or by_bytes:
        names = sorted(counted | by_bytes)
        text = "changed in place: " + ", ".join(names)
        if by_bytes:  # torch did not count the write: say how it got past, so the user finds it
            which = "" if by_bytes == set(names) else ", ".join(sorted(by_bytes)) + ": "
            text += (f" ({which}bytes changed with no in-place operation torch counts, e.g. a write through .numpy() "
                     "or .data)")
        _fail(entry, "its inputs left unchanged", text)


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {_shape(value)}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__} ({_short(value)})"


def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _short(value: Any) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 80 else text[:77] + "..."

