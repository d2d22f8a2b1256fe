"""The decoder layers' elementwise kernels on a GPU: transformers' own, liger's fused ones, torch.compile'd ones.

A profile of one GRPO step at the BFCL shape on an H100 (``gpu_step.py --profile``, issue 24) put
about a quarter of the device time in elementwise kernels (the RMSNorms' float32 upcasts and
means, the rotary embedding's products and concatenations, SwiGLU's product), beside the flex
attention (about a third) and the matrix products. This measures what fusing them buys and what
it costs in accuracy, per arm:

* ``torch``: transformers' modules (``optim.layer_kernels: torch``), the baseline of the same run;
* ``liger``: liger-kernel's RMSNorm and SwiGLU on the instance (``optim.layer_kernels: liger``);
* ``liger_rope``: the same plus liger's rotary kernel, which liger can only install for every
  Qwen3 of the process (a module-level patch; measured here, not offered by the toolkit);
* ``compiled``: ``torch.compile(dynamic=True)`` of each norm and MLP module (the rotary embedding
  and attention stay eager: the attention call takes the tree mask object).

Accuracy: a 2-layer model of the shape in float32 is the reference; each arm's bfloat16 copy runs
the same input (forward, and the backward of the mean square of the last hidden state), and the
record gives each arm's largest relative error against float32 (hidden state; the worst
parameter's gradient, max |g - g_ref| / max |g_ref|), so that a fused arm's error can be read
against the plain bfloat16 arm's own. Time: one GRPO step (:func:`multiturn_cost.measure_step`,
prefix-shared, checkpointing on) per arm, after a warm-up step. Each record is appended to
``--out`` as it finishes::

    python benchmarks/layer_kernels.py --out results/layer_kernels.jsonl              # one GPU
    python benchmarks/layer_kernels.py --shape tiny --device cpu --arms torch,compiled --out /tmp/k.jsonl
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time
from pathlib import Path
from types import MethodType

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ARMS = ("torch", "liger", "liger_rope", "compiled")
_COMPILED: dict = {}  # module class -> its compiled forward
_PLAIN_ROPE: dict = {}  # transformers' rotary function, kept while liger's replaces it


def make_arm(model: torch.nn.Module, arm: str, device: torch.device) -> torch.nn.Module:
    """``model`` (changed in place) running ``arm``'s kernels."""
    from seeupo.llm.distributed import decoder_layers
    from seeupo.llm.kernels import apply_layer_kernels

    if arm in ("liger", "liger_rope"):
        apply_layer_kernels(model, "liger", device)
    if arm == "liger_rope":
        from liger_kernel.transformers.monkey_patch import apply_liger_kernel_to_qwen3
        from transformers.models.qwen3 import modeling_qwen3

        _PLAIN_ROPE.setdefault("qwen3", modeling_qwen3.apply_rotary_pos_emb)
        apply_liger_kernel_to_qwen3(rope=True, rms_norm=False, swiglu=False, fused_linear_cross_entropy=False)
    if arm == "compiled":
        # one compiled function per class, bound to each instance: a deep copy (the step's own
        # copy, the reference's) then binds it to the copy's modules, not to this model's
        modules = [model.model.norm]
        for layer in decoder_layers(model):
            modules += [layer.input_layernorm, layer.post_attention_layernorm, layer.mlp]
            modules += [getattr(layer.self_attn, n) for n in ("q_norm", "k_norm") if hasattr(layer.self_attn, n)]
        # rank 3 and 4 inputs (the layer norms, the q/k norms), grad on and off, a few size ranges
        torch._dynamo.config.recompile_limit = 64
        for module in modules:
            cls = type(module)
            if cls not in _COMPILED:
                _COMPILED[cls] = torch.compile(cls.forward, dynamic=True)
            module.forward = MethodType(_COMPILED[cls], module)
    return model


def unpatch_rope() -> None:
    """Undo ``liger_rope``'s module-level rotary patch (the next arm runs transformers' own)."""
    from transformers.models.qwen3 import modeling_qwen3

    if "qwen3" in _PLAIN_ROPE:
        modeling_qwen3.apply_rotary_pos_emb = _PLAIN_ROPE["qwen3"]


def accuracy(shape: str, arms: list[str], device: torch.device, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Each arm's relative error in ``dtype`` against a float32 2-layer model of ``shape`` (module docstring)."""
    import multiturn_cost as mc

    reference = mc.shape_model(shape, torch.float32, device)
    reference.model.layers = reference.model.layers[:2]
    reference.config.num_hidden_layers = 2
    ids = torch.randint(10, min(1000, reference.config.vocab_size), (2, 1024),
                        generator=torch.Generator().manual_seed(3)).to(device)

    def run(model):
        hidden = model.model(ids).last_hidden_state
        hidden.float().square().mean().backward()
        return hidden.detach().float(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}

    want, want_grads = run(reference)
    out = {}
    for arm in arms:
        try:
            model = make_arm(copy.deepcopy(reference).to(dtype), arm, device)
            model.zero_grad(set_to_none=True)
            got, grads = run(model)
            error = torch.stack([(grads[n] - want_grads[n]).square().sum() for n in want_grads]).sum().sqrt()
            out[arm] = {"hidden_rel": float((got - want).abs().max() / want.abs().max()),
                        "grad_rel": float(error / torch.stack([g.square().sum() for g in want_grads.values()]).sum().sqrt())}
        except Exception as error:
            out[arm] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        finally:
            if arm == "liger_rope":
                unpatch_rope()
    return out


def main(argv: list[str] | None = None) -> int:
    import multiturn_cost as mc
    from gpu_step import check_kernels, update_mfu
    from gpu_train import PEAK_BF16, SHAPES

    from seeupo.llm.distributed import enable_activation_checkpointing

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen3-1.7b", choices=("qwen3-1.7b", "tiny"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--context", type=int, default=5833)
    p.add_argument("--deadline", type=float, default=300.0, help="seconds after which no arm starts")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    if not set(arms) <= set(ARMS):
        print(f"error: --arms takes {', '.join(ARMS)}; got {args.arms!r}", file=sys.stderr)
        return 2
    started = time.time()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out = open(args.out, "a")

    def emit(record: dict) -> None:
        record["elapsed_s"] = round(time.time() - started, 1)
        print(json.dumps(record), flush=True)
        out.write(json.dumps(record) + "\n")
        out.flush()

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    emit({"event": "accuracy", "device": name, "torch": torch.__version__} | accuracy(args.shape, arms, device))
    logprobs, _ = check_kernels(device, dtype, "auto")
    batch, _ = mc.bfcl_batch(SHAPES[args.shape]["vocab_size"], 10, tasks=1, group=8, turns=args.turns,
                             context=args.context, response=150, observation=200)
    cfg = mc._config("grpo", argparse.Namespace(group=8, epochs=1, minibatches=1))
    peak = next((v for k, v in PEAK_BF16.items() if k in name), 0.0)
    failed = 0
    for arm in arms:
        if time.time() - started > args.deadline:
            emit({"event": "skipped", "arm": arm, "why": "deadline"})
            continue
        record = {"event": "step", "arm": arm, "T": args.turns, "preset": "grpo", "layout": "prefix_shared", "device": name}
        try:
            model = make_arm(mc.shape_model(args.shape, dtype, device), arm, device)
            if device.type == "cuda":
                enable_activation_checkpointing(model)
            for rep in ("warm", "timed"):
                start = time.perf_counter()
                result = mc.measure_step(model, batch, cfg, "prefix_shared", micro_batch_rows=8, logprobs=logprobs)
                record[f"{rep}_wall_s"] = time.perf_counter() - start
            record |= {"seconds": result["seconds"], "step_seconds": sum(result["seconds"].values()),
                       "peak_gib": max(result["peak_mib"].values()) / 1024, "update_mfu": update_mfu(model, result, peak),
                       "tokens": result["tokens"]}
        except Exception as error:
            record["error"] = f"{type(error).__name__}: {str(error)[:400]}"
            failed += 1
        finally:
            if arm == "liger_rope":
                unpatch_rope()
        emit(record)
        model = result = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    emit({"event": "done", "total_s": round(time.time() - started, 1), "failed_steps": failed})
    return 1 if failed else 0  # every arm was tried; a failed one is in the record, and in the exit code


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
