"""seeupo.llm.kernels: liger's fused RMSNorm / SwiGLU on one model instance, and only there."""

from __future__ import annotations

import copy
import sys
from types import MethodType

import pytest

pytest.importorskip("transformers")

import torch

import seeupo.llm.kernels as kernels
import seeupo.llm.logprobs as logprobs
from seeupo.llm.kernels import apply_layer_kernels, layer_kernels_unavailable
from seeupo.llm.logprobs import liger_unavailable


def test_torch_and_auto_on_the_cpu_leave_the_model_alone(tiny32):
    model = copy.deepcopy(tiny32[0])
    norm_forward = model.model.norm.forward
    assert apply_layer_kernels(model, "torch", "cpu") == "torch"
    assert apply_layer_kernels(model, "auto", "cpu") == "torch"
    assert model.model.norm.forward == norm_forward
    assert "need a CUDA device" in layer_kernels_unavailable(model, "cpu")


def test_liger_where_it_cannot_run_and_unknown_choices_are_errors(tiny32):
    with pytest.raises(ValueError, match="layer kernels 'liger' cannot run: liger-kernel's Triton kernels need a CUDA"):
        apply_layer_kernels(tiny32[0], "liger", "cpu")
    with pytest.raises(ValueError, match="unknown layer kernels 'fast'"):
        apply_layer_kernels(tiny32[0], "fast", "cpu")  # type: ignore[arg-type]


def test_unknown_model_type_is_named(tiny32, monkeypatch):
    monkeypatch.setattr(logprobs, "_liger_unavailable", lambda device_type: None)
    monkeypatch.setattr(kernels, "_liger_apply_functions", lambda: {"llama": None})
    assert layer_kernels_unavailable(tiny32[0], "cuda") == "liger-kernel has no layer kernels for model type 'qwen3'"
    assert apply_layer_kernels(tiny32[0], "auto", "cuda") == "torch"


def test_only_the_instance_changes(tiny32, monkeypatch):
    """liger's apply functions also replace the transformers module's classes and the model's forward
    (a fused loss head); a stand-in that does the same shows both undone, the instance's norms changed."""
    modeling = sys.modules[type(tiny32[0]).__module__]
    original_class = modeling.Qwen3RMSNorm
    calls = []

    def scaled_norm_forward(self, x):  # distinguishable from the real norm
        return 2.0 * original_class.forward(self, x)

    def fake_apply(model=None, rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True, cross_entropy=False):
        calls.append(dict(rope=rope, rms_norm=rms_norm, swiglu=swiglu, flce=fused_linear_cross_entropy, ce=cross_entropy))
        modeling.Qwen3RMSNorm = type("LigerRMSNorm", (torch.nn.Module,), {})
        model.forward = MethodType(lambda self, *a, **k: None, model)
        model.model.norm.forward = MethodType(scaled_norm_forward, model.model.norm)

    monkeypatch.setattr(logprobs, "_liger_unavailable", lambda device_type: None)
    monkeypatch.setattr(kernels, "_liger_apply_functions", lambda: {"qwen3": fake_apply})
    model = copy.deepcopy(tiny32[0])
    ids = torch.tensor([[3, 5, 7, 9]])
    plain = model(ids).logits
    assert apply_layer_kernels(model, "auto", "cuda") == "liger"
    assert calls == [dict(rope=False, rms_norm=True, swiglu=True, flce=False, ce=False)]
    assert modeling.Qwen3RMSNorm is original_class
    assert "forward" not in vars(model)
    assert not torch.allclose(model(ids).logits, plain)  # the instance runs the replaced norm
    assert torch.equal(tiny32[0](ids).logits, plain)  # the model it was copied from does not


_NO_LIGER = liger_unavailable("cuda")


@pytest.mark.skipif(_NO_LIGER is not None, reason=f"liger layer kernels: {_NO_LIGER}")
def test_liger_layer_kernels_close_to_torch_on_cuda(tiny32):
    """Forward and the gradients of a tiny Qwen3 with and without liger's norms and MLP, float32 on CUDA."""
    plain = copy.deepcopy(tiny32[0]).cuda()
    fused = copy.deepcopy(plain)
    assert apply_layer_kernels(fused, "liger", "cuda") == "liger"
    ids = torch.randint(10, 500, (2, 48), generator=torch.Generator().manual_seed(0)).cuda()
    outs = []
    for model in (plain, fused):
        logits = model(ids).logits
        logits.float().square().mean().backward()
        outs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (a, grads_a), (b, grads_b) = outs
    assert (a - b).abs().max().item() < 1e-4
    for name, grad in grads_a.items():
        assert (grad - grads_b[name]).abs().max().item() < 1e-4 * max(grad.abs().max().item(), 1.0), name
