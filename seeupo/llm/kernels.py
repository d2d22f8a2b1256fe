"""Fused kernels for a decoder's norms and MLP: liger-kernel's RMSNorm and SwiGLU, on one model instance.

A transformers decoder layer runs its RMSNorms as five elementwise kernels (a float32 upcast, the
square, the mean, the scaling, the downcast) and its SwiGLU MLP's ``silu(gate) * up`` as two, each
reading and writing the whole activation. liger-kernel (the ``gpu`` extra) fuses each into one
Triton kernel with the same arithmetic (float32 inside, the model's dtype out; liger's "llama"
casting mode, which is what Qwen and Llama compute). The rotary embedding is left alone:
transformers applies it through a module-level function, which liger can only replace for every
model of that family in the process.

:func:`apply_layer_kernels` changes only the instance it is given (its RMSNorm and MLP modules'
``forward``), before it is sharded, checkpointed or copied for the reference model. liger's own
entry points also replace the transformers module's classes for models built later; that part is
undone here, so that a model built afterwards (a CPU model in the same process included) is the
plain one. The plain path stays what ``optim.layer_kernels: torch`` runs; ``benchmarks/gpu_step.py``
checks the fused path against it on the GPU before timing.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import TYPE_CHECKING, Literal, get_args

import torch

if TYPE_CHECKING:
    from seeupo.llm.config import TrainConfig

LayerKernels = Literal["auto", "liger", "torch"]
"""``optim.layer_kernels``: ``"auto"`` liger where :func:`layer_kernels_unavailable` finds no reason
against it, else ``"torch"`` (transformers' own modules)."""


def layer_kernels_unavailable(model: torch.nn.Module, device: torch.device | str) -> str | None:
    """Why liger's layer kernels cannot run for ``model`` on ``device`` (one line), or ``None`` if they can."""
    from seeupo.llm.logprobs import liger_unavailable

    reason = liger_unavailable(device)
    if reason is not None:
        return reason
    return model_type_unsupported(getattr(getattr(model, "config", None), "model_type", None))


def model_type_unsupported(model_type: str | None) -> str | None:
    """Why liger-kernel has no layer kernels for a transformers ``model_type`` (one line), or ``None``
    if it has: read before a model is loaded, from its config alone."""
    if model_type not in _liger_apply_functions():
        return f"liger-kernel has no layer kernels for model type {model_type!r}"
    return None


def refuse_liger_where_it_cannot_run(cfg: TrainConfig) -> None:
    """Refuse ``optim.logprobs`` / ``optim.layer_kernels: liger`` where the run will not have CUDA (one
    process trains on the CPU; under torchrun each process on its GPU, where there is one), or layer
    kernels liger has none of for the model's type, as an :class:`~seeupo.validation.errors.InputError` naming
    the field: one line before the run folder exists or the model is loaded and warmed up, not a
    traceback at the first pass. A model whose type its config does not say is checked once loaded."""
    from seeupo.llm.build import model_type
    from seeupo.llm.distributed import launched_by_torchrun
    from seeupo.llm.logprobs import liger_unavailable
    from seeupo.validation.errors import InputError

    reason = liger_unavailable("cuda" if launched_by_torchrun() and torch.cuda.is_available() else "cpu")
    for field in ("logprobs", "layer_kernels"):
        if getattr(cfg.optim, field) == "liger" and reason is not None:
            raise InputError(f"config.optim.{field}", f"'liger' cannot run: {reason}")
    kind = model_type(cfg.model.name)  # None: a folder whose config.json does not say; checked once loaded
    if cfg.optim.layer_kernels == "liger" and kind is not None:
        unsupported = model_type_unsupported(kind)
        if unsupported is not None:
            raise InputError("config.optim.layer_kernels", f"'liger' cannot run: {unsupported}")


def apply_layer_kernels(model: torch.nn.Module, choice: LayerKernels, device: torch.device | str) -> str:
    """Give ``model``'s RMSNorms and SwiGLU MLPs liger's fused kernels as ``choice`` says; returns
    what runs now, ``"liger"`` or ``"torch"``.

    ``"liger"`` where it cannot run is a ``ValueError`` with the reason. Only ``model`` changes
    (module docstring); its parameters, and so its state dict and checkpoints, stay the same.
    """
    if choice not in get_args(LayerKernels):
        raise ValueError(f"unknown layer kernels {choice!r}; expected one of {get_args(LayerKernels)}")
    if choice == "torch":
        return "torch"
    reason = layer_kernels_unavailable(model, device)
    if reason is not None:
        if choice == "liger":
            raise ValueError(f"layer kernels 'liger' cannot run: {reason}")
        return "torch"
    apply = _liger_apply_functions()[model.config.model_type]
    wanted = dict(rope=False, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False,
                  geglu=False, layer_norm=False)
    accepted = inspect.signature(apply).parameters
    modeling = sys.modules[type(model).__module__]
    before = dict(vars(modeling))
    had_forward = "forward" in vars(model)
    try:
        apply(model=model, **{k: v for k, v in wanted.items() if k in accepted})
    finally:  # liger also swaps the module's classes and functions for models built later: put them back
        for name, value in before.items():
            if vars(modeling).get(name) is not value:
                setattr(modeling, name, value)
        if not had_forward:  # its fused head would replace the log-prob path: seeupo.llm.logprobs has its own
            vars(model).pop("forward", None)
    return "liger"


def _liger_apply_functions() -> dict:
    """liger-kernel's ``model_type -> apply_liger_kernel_to_*`` table (empty where it does not import)."""
    try:
        return importlib.import_module("liger_kernel.transformers.monkey_patch").MODEL_TYPE_TO_APPLY_LIGER_FN
    except Exception:  # noqa: BLE001 — not installed or Triton missing: no fused kernels, the reason comes from liger_unavailable
        return {}
