"""One training step per (turns, preset, layout) at a real model shape on one GPU: seconds, tokens/s, peak memory, MFU.

The GPU table of issue 24 ("Fast on one GPU at the paper's shape"), measured by one prepared call
(``make benchmark-gpu``): a randomly initialised model of a released shape (``--shape qwen3-1.7b``,
bf16; no weights needed) on the BFCL-shaped batch of ``benchmarks/multiturn_cost.py`` (prompt
5,833 tokens, ``T`` turns of 150 response + 200 observation tokens, G = 8, one task), one step as
the trainer makes it (:func:`multiturn_cost.measure_step`: rescoring unless the update is one optimizer step, reference, update), for every
``T:preset:layout`` of ``--plan``. Each (T, layout) gets one warm-up step before its first timed step
(compilation of the flex attention kernel, allocator growth). Every result is appended to
``--out`` (JSON lines) as it finishes, so a run cut short still reports what it measured; a step
that fails (out of memory included) is recorded as an error and the run goes on. ``--deadline``
skips what would start after it.

Settings are the trainer's defaults on a GPU: activation checkpointing on (``parallel.
activation_checkpointing: auto``), liger's RMSNorm and SwiGLU kernels (``optim.layer_kernels:
auto``; first checked against a float32 copy, :func:`check_layer_kernels`), no token budget given (``micro_batch_tokens`` chosen from the
device's memory, :mod:`seeupo.llm.memory`), ``micro_batch_rows`` 8, tree attention (flex) for the
packed layouts, the LM head on the read positions only.

Per step: ``seconds`` per pass type, ``step_seconds``, ``peak_gib`` (the largest
``torch.cuda.max_memory_allocated`` over the pass types), ``update_tokens_per_s`` (tokens forwarded
by the update / its seconds) and ``update_mfu``: model FLOPs of the update / seconds / the device's
dense bf16 peak, with model FLOPs = 6 x non-embedding parameters x tokens forwarded + 6 x hidden x
vocabulary x response tokens scored + 12 x layers x heads x head_dim x attention pairs (the
(query, key) pairs of causal attention over real tokens, counted exactly per call); activation
recomputation is not counted (the convention of ``benchmarks/gpu_train.py``).

``--arms`` runs the plan once per arm on the same model: ``default`` (the settings above) and
arms that pull levers (:data:`LEVERS`) on top of them, so that a lever's gain is measured
against a baseline of the same run; each record names its ``arm``.

``--shape tiny --device cpu`` is the CPU dry run of the same code (a few seconds; in CI through
``make benchmark-gpu SHAPE=tiny DEVICE=cpu``)::

    python benchmarks/gpu_step.py --shape qwen3-1.7b --device cuda --out results/gpu_step.jsonl
    python benchmarks/gpu_step.py --shape tiny --device cpu --context 200 --out /tmp/gpu_step.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# the levers an arm may pull on top of the trainer's defaults (``--arms``, "+"-joined):
#   previous: a scoring pass of logp_old before the update and torch's default AdamW (the defaults
#     before the on-policy update scored its own old log-probabilities and AdamW was fused);
#   as_needed: ``parallel.activation_checkpointing: as_needed`` (each pass recomputes only the
#     layers its memory requires);
#   segments: the segment tree kernel (sdpa per segment, flash attention's lower-right causal rule)
#     instead of flex attention;
#   autotune: flex attention compiled with mode="max-autotune-no-cudagraphs" (Inductor benchmarks
#     the kernel's block sizes and warps on the device; minutes of compilation at the first step);
#   share=F: ``parallel.memory_share`` F (the share of the device's memory the token budget and
#     as_needed plan for; default 0.85);
#   recompute_attention: a checkpointed layer recomputes its attention kernel too instead of
#     keeping its inputs and output (``enable_activation_checkpointing(keep_attention=False)``, the
#     default before it kept them);
#   cascade: the cascade tree kernel (per group: the branches against their prefix in one call,
#     each branch causally, merged by log-sum-exp; torch's flash kernel on CUDA) instead of flex;
#   flex=NAME: flex attention called with the kernel options NAME of ``flex_options.OPTION_SETS``
#     (``benchmarks/flex_options.py`` measures the kernel alone with each).
LEVERS = ("previous", "as_needed", "segments", "cascade", "autotune", "share=F", "recompute_attention", "flex=NAME")


def parse_arm(arm: str) -> tuple[set[str], float | None]:
    """``(the named levers, the memory share or None)`` of an ``--arms`` item; ValueError if malformed."""
    if arm == "default":
        return set(), None
    levers, share = set(), None
    for lever in arm.split("+"):
        if lever.startswith("share="):
            try:
                share = float(lever[len("share="):])
            except ValueError:
                share = math.nan
            if not 0 < share <= 1:  # NaN too
                raise ValueError(f"{lever!r}: the share must be a number in (0, 1]")
        elif lever.startswith("flex="):
            from flex_options import OPTION_SETS

            if lever[len("flex="):] not in OPTION_SETS:
                raise ValueError(f"{lever!r}: flex takes one of {', '.join(OPTION_SETS)}")
            levers.add(lever)
        elif lever in LEVERS:
            levers.add(lever)
        else:
            raise ValueError(f"unknown lever {lever!r}")
    if {"segments", "cascade"} <= levers:
        raise ValueError("segments and cascade each choose the tree kernel: pull one")
    return levers, share

DEFAULT_PLAN = ("10:grpo:packed,10:grpo:prefix_shared,10:seeupo:prefix_shared,10:seeupo:packed,"
                "10:seeupo-unfused:prefix_shared,5:grpo:prefix_shared,5:seeupo:prefix_shared,5:grpo:per_row,"
                "5:seeupo:per_row")


def update_mfu(model: torch.nn.Module, result: dict, peak_flops: float) -> float | None:
    """The update's model FLOPs per second over ``peak_flops`` (module docstring); ``None`` without timing."""
    seconds = result.get("seconds", {}).get("update")
    if not seconds or not peak_flops:
        return None
    c = model.config
    non_embedding = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    if c.tie_word_embeddings:  # the tied head is the embedding: its matrix product counts as the head below
        non_embedding = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n)
    else:
        non_embedding -= c.hidden_size * c.vocab_size  # likewise
    flops = (6.0 * non_embedding * result["tokens"]["update"] + 6.0 * c.hidden_size * c.vocab_size * result["reads"].get("update", 0)
             + 12.0 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * result["attention_pairs"]["update"])
    return flops / seconds / peak_flops


def check_kernels(device: torch.device, dtype: torch.dtype, logprobs: str) -> tuple[str, dict]:
    """Try the GPU kernels on small inputs before the table: the flex tree kernel against the segment
    kernel, and the log-prob path against the reference path (forward and backward). A kernel that
    fails or disagrees is replaced for the rest of the run (flex -> segments, liger -> chunked) and
    the record says so, so that one broken kernel does not cost the whole table.
    Returns ``(the log-prob path to use, record)``."""
    import seeupo.llm.passes as passes_module  # where the policy's passes pick their kernel
    from seeupo.llm import logprobs as lp
    from seeupo.llm.tree_attention import pack_tree, tree_attention

    record: dict = {}
    if device.type == "cuda":
        try:
            g = torch.Generator().manual_seed(0)
            lengths, prefix, prefix_row = torch.tensor([300, 150, 40]), torch.tensor([100, 100, 0]), torch.tensor([0, 0, 1])
            ids = torch.randint(3, 50, (3, 300), generator=g)
            ids[1, :100] = ids[0, :100]
            flex = pack_tree(ids.to(device), lengths, prefix, prefix_row, "flex").mask
            seg = pack_tree(ids.to(device), lengths, prefix, prefix_row, "segments").mask
            n, real = flex.length, flex.tokens
            q, k, v = (torch.randn(1, h, n, 64, generator=g).to(device, dtype).requires_grad_() for h in (8, 4, 4))
            a = tree_attention(q, k, v, flex, 0.125)[:, :, :real]
            b = tree_attention(q[:, :, :real], k[:, :, :real], v[:, :, :real], seg, 0.125)
            (a.float().sum() + b.float().sum()).backward()
            record["flex_vs_segments_max_abs"] = float((a - b).detach().abs().max())
            if record["flex_vs_segments_max_abs"] > 0.05:
                raise ValueError(f"flex differs from segments by {record['flex_vs_segments_max_abs']}")
            record["tree_kernel"] = "flex"
        except Exception as error:
            passes_module.default_kernel = lambda device: "segments"
            record |= {"tree_kernel": "segments", "flex_error": f"{type(error).__name__}: {str(error)[:300]}"}
    path = logprobs
    try:
        g = torch.Generator().manual_seed(1)
        hidden = torch.randn(64, 256, generator=g).to(device, dtype).requires_grad_()
        weight = (0.05 * torch.randn(1000, 256, generator=g)).to(device, dtype).requires_grad_()
        target = torch.randint(0, 1000, (64,), generator=g).to(device)
        got = lp.logprob_backend(logprobs, device)(hidden, weight, target, 0.9)
        want = lp.token_logprobs_reference(hidden, weight, target, 0.9)
        got.sum().backward()
        record["logprobs_vs_reference_max_abs"] = float((got - want).detach().abs().max())
        if record["logprobs_vs_reference_max_abs"] > 0.05:
            raise ValueError(f"differs from the reference by {record['logprobs_vs_reference_max_abs']}")
    except Exception as error:
        path = "chunked"
        record["logprobs_error"] = f"{type(error).__name__}: {str(error)[:300]}"
    record["logprobs"] = path
    return path, record


def profile_step(step, top: int = 40) -> dict:
    """Where one step's device time goes: the ``top`` kernels by their own device time (torch.profiler),
    the total over all kernels and the step's wall time (their difference is time the device waited);
    on the CPU, the operators' own CPU time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        step()
        wall = time.perf_counter() - start
    events = [e for e in prof.key_averages() if (e.self_device_time_total if cuda else e.self_cpu_time_total) > 0]
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    events.sort(key=own, reverse=True)
    return {"clock": "device" if cuda else "cpu", "total_ms": sum(own(e) for e in events) / 1e3,
            "wall_ms": round(wall * 1e3, 1),
            "top": [{"name": e.key[:160], "ms": round(own(e) / 1e3, 2), "count": e.count} for e in events[:top]]}


def check_layer_kernels(model: torch.nn.Module, shape: str, device: torch.device, choice: str) -> dict:
    """Apply ``optim.layer_kernels`` (``choice``) to ``model`` as the trainer does, after measuring the
    fused layers' error against a float32 copy beside the plain layers' own in ``model``'s dtype
    (:func:`layer_kernels.accuracy`: a 2-layer model, forward and gradients). A fused path that
    fails, or errs more than twice the plain one (+1e-3), leaves ``model`` on the torch modules,
    and the record says why."""
    from layer_kernels import accuracy

    from seeupo.llm.kernels import apply_layer_kernels, layer_kernels_unavailable

    record: dict = {}
    try:
        if choice != "torch" and layer_kernels_unavailable(model, device) is None:
            errors = accuracy(shape, ["torch", "liger"], device, next(model.parameters()).dtype)
            record["layer_kernels_accuracy"] = errors
            plain, fused = errors["torch"], errors["liger"]
            if "error" in fused or any(fused[k] > 2 * plain[k] + 1e-3 for k in ("hidden_rel", "grad_rel")):
                raise ValueError(f"fused layers against float32: {fused}; plain: {plain}")
        record["layer_kernels"] = apply_layer_kernels(model, choice, device)
    except Exception as error:
        record |= {"layer_kernels": "torch", "layer_kernels_error": f"{type(error).__name__}: {str(error)[:300]}"}
    return record


@contextlib.contextmanager
def pulled(levers: set[str], model: torch.nn.Module):
    """Within the block, ``model``'s steps run with the ``levers`` (:data:`LEVERS`) that act on the
    model or the policy's kernel choice ("previous" acts through ``measure_step``'s arguments)."""
    import seeupo.llm.passes as passes_module  # where the policy's passes pick their kernel
    import seeupo.llm.tree_attention as tree_module
    from seeupo.llm.distributed import enable_activation_checkpointing
    from seeupo.llm.memory import AS_NEEDED, is_checkpointed, keeps_attention

    kernel, as_needed = passes_module.default_kernel, getattr(model, AS_NEEDED, False)
    compiled, kept = tree_module._compiled_flex, keeps_attention(model)
    if "recompute_attention" in levers and is_checkpointed(model):
        enable_activation_checkpointing(model, as_needed, keep_attention=False)
    if "as_needed" in levers:  # every step's copy of the model (and a critic's backbone) inherits it
        object.__setattr__(model, AS_NEEDED, True)
        object.__setattr__(model.base_model, AS_NEEDED, True)
    if "segments" in levers or "cascade" in levers:
        chosen = "cascade" if "cascade" in levers else "segments"
        passes_module.default_kernel = lambda device: chosen
    if "autotune" in levers:
        tree_module._compiled_flex = _autotuned_flex
    flex_options = [lever[len("flex="):] for lever in levers if lever.startswith("flex=")]
    if flex_options:
        from flex_options import OPTION_SETS

        flex = tree_module._compiled_flex()
        options = OPTION_SETS[flex_options[0]]
        tree_module._compiled_flex = lambda: functools.partial(flex, kernel_options=dict(options) or None)
    try:
        yield
    finally:
        passes_module.default_kernel = kernel
        object.__setattr__(model, AS_NEEDED, as_needed)
        object.__setattr__(model.base_model, AS_NEEDED, as_needed)
        tree_module._compiled_flex = compiled
        if "recompute_attention" in levers and is_checkpointed(model):
            enable_activation_checkpointing(model, as_needed, keep_attention=kept)


@functools.cache
def _autotuned_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True, mode="max-autotune-no-cudagraphs")


def main(argv: list[str] | None = None) -> int:
    import multiturn_cost as mc
    from gpu_train import PEAK_BF16

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen3-1.7b", choices=("qwen3-1.7b", "qwen3-8b", "tiny"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, choices=("bfloat16", "float32"), help="default: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--plan", default=DEFAULT_PLAN, help="comma-separated TURNS:PRESET:LAYOUT")
    p.add_argument("--context", type=int, default=5833, help="the prompt's tokens (BFCL median)")
    p.add_argument("--checkpointing", default="auto", choices=("auto", "on", "off"),
                   help="activation checkpointing (auto: on CUDA)")
    p.add_argument("--micro-batch-tokens", type=int, default=None, help="default: chosen from the device's memory")
    p.add_argument("--logprobs", default="auto", choices=("auto", "chunked", "reference", "liger"),
                   help="the log-prob path (optim.logprobs)")
    p.add_argument("--layer-kernels", default="auto", choices=("auto", "liger", "torch"),
                   help="the decoder layers' norm and MLP kernels (optim.layer_kernels)")
    p.add_argument("--arms", default="default",
                   help=f"comma-separated arms, each 'default' or '+'-joined levers of {', '.join(LEVERS)}: "
                        "the plan runs once per arm, on the same model")
    p.add_argument("--profile", action="store_true", help="after the plan, profile one step of its first item")
    p.add_argument("--deadline", type=float, default=420.0, help="seconds after which no step starts")
    p.add_argument("--out", required=True, help="JSON-lines file the results are appended to")
    args = p.parse_args(argv)
    started = time.time()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    plan = []
    for item in args.plan.split(","):
        parts = item.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in mc.PRESETS or parts[2] not in mc.LAYOUTS:
            print(f"error: --plan takes TURNS:PRESET:LAYOUT items (presets {', '.join(mc.PRESETS)}; layouts "
                  f"{', '.join(mc.LAYOUTS)}); got {item!r}", file=sys.stderr)
            return 2
        plan.append((int(parts[0]), parts[1], parts[2]))
    arms: dict[str, tuple[set[str], float | None]] = {}
    for arm in (arm.strip() for arm in args.arms.split(",")):
        try:
            arms[arm] = parse_arm(arm)
        except ValueError as error:
            print(f"error: --arms takes 'default' or '+'-joined levers of {', '.join(LEVERS)}; got {arm!r} ({error})",
                  file=sys.stderr)
            return 2
    out = open(args.out, "a")

    def emit(record: dict) -> None:
        record["elapsed_s"] = round(time.time() - started, 1)
        line = json.dumps(record)
        print(line, flush=True)
        out.write(line + "\n")
        out.flush()

    import transformers

    from seeupo.llm.distributed import enable_activation_checkpointing

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), 0.0)
    model = mc.shape_model(args.shape, dtype, device)
    layer_kernels = check_layer_kernels(model, args.shape, device, args.layer_kernels)  # before checkpointing, as the trainer
    checkpointing = args.checkpointing == "on" or (args.checkpointing == "auto" and device.type == "cuda")
    if checkpointing:
        enable_activation_checkpointing(model)
    logprobs, kernels = check_kernels(device, dtype, args.logprobs)
    emit({"event": "setup", "device": name, "shape": args.shape, "dtype": str(dtype), "checkpointing": checkpointing,
          "torch": torch.__version__, "transformers": transformers.__version__, "setup_s": round(time.time() - started, 1)}
         | kernels | layer_kernels)
    batches: dict[int, object] = {}  # turns -> the batch (one at a time: the plan is grouped by turns)
    warmed: set[tuple[str, int, str]] = set()
    failed = 0
    for arm, (turns, preset, layout) in ((arm, item) for arm in arms for item in plan):
        levers, share = arms[arm]
        if turns not in batches:
            batches.clear()
            batches[turns], _ = mc.bfcl_batch(model.config.vocab_size, 10, tasks=1, group=8, turns=turns,
                                              context=args.context, response=150, observation=200)
        batch = batches[turns]
        cfg = mc._config(preset, argparse.Namespace(group=8, epochs=1, minibatches=1))
        reps = ("timed",) if (arm, turns, layout) in warmed else ("warm", "timed")
        for rep in reps:
            if time.time() - started > args.deadline:
                emit({"event": "skipped", "arm": arm, "T": turns, "preset": preset, "layout": layout, "rep": rep,
                      "why": "deadline"})
                continue
            record = {"event": "step", "arm": arm, "T": turns, "preset": preset, "layout": layout, "rep": rep, "device": name}
            step_start = time.perf_counter()
            try:
                with pulled(levers, model):
                    result = mc.measure_step(model, batch, cfg, layout, micro_batch_rows=8,
                                             micro_batch_tokens=args.micro_batch_tokens, fuse=mc._fused(preset),
                                             logprobs=logprobs, rescore=True if "previous" in levers else None,
                                             fused_adamw="previous" not in levers, memory_share=share)
                record |= result
                record["step_seconds"] = sum(result["seconds"].values())
                record["peak_gib"] = max(result["peak_mib"].values()) / 1024
                record["update_tokens_per_s"] = result["tokens"]["update"] / result["seconds"]["update"]
                record["update_mfu"] = update_mfu(model, result, peak)
            except Exception as error:  # an out-of-memory step is a result too; the run goes on
                record["error"] = f"{type(error).__name__}: {str(error)[:400]}"
                failed += 1
            record["wall_seconds"] = time.perf_counter() - step_start
            emit(record)
            warmed.add((arm, turns, layout))
            result = None
            gc.collect()  # the step's model copies sit in reference cycles: free them before the next peak is read
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.profile and plan and time.time() - started < args.deadline:
        turns, preset, layout = plan[0]
        batch, _ = mc.bfcl_batch(model.config.vocab_size, 10, tasks=1, group=8, turns=turns,
                                 context=args.context, response=150, observation=200)
        cfg = mc._config(preset, argparse.Namespace(group=8, epochs=1, minibatches=1))
        try:
            emit({"event": "profile", "T": turns, "preset": preset, "layout": layout, "device": name}
                 | profile_step(lambda: mc.measure_step(model, batch, cfg, layout, micro_batch_rows=8,
                                                        micro_batch_tokens=args.micro_batch_tokens,
                                                        fuse=mc._fused(preset), logprobs=logprobs)))
        except Exception as error:
            emit({"event": "profile", "error": f"{type(error).__name__}: {str(error)[:400]}"})
    emit({"event": "done", "total_s": round(time.time() - started, 1), "failed_steps": failed})
    return 1 if failed else 0  # every step was tried; a failed one is in the record, and in the exit code


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
