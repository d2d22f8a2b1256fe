"""The tree attention kernel alone at the BFCL shape: flex attention's kernel options, and torch's dense kernels beside it.

A profile of one SeeUPO step on an H200 (benchmarks/RESULTS.md, fourth pass) put flex attention at
46% of the step, its forward at about 31% of the GPU's peak and its backward at about 20%, where
the matrix products ran at 66%. This measures the kernel by itself, one pass's tree at the issue's
shape, so that a kernel option can be judged in seconds rather than a whole step per arm:

* the tree: one group, a ``--context``-token prompt shared by ``--group`` branches of ``--turns``
  x 350 tokens (150 response + 200 observation), packed into one row as ``pack_tree`` lays it
  out for the flex kernel, with its block mask; q, k, v random in bf16 with Qwen3-1.7B's heads
  (16 query heads, 8 key-value heads, head dim 128);
* each option set of :data:`OPTION_SETS` (``flex_attention``'s ``kernel_options``, compiled as
  the policy compiles it): forward seconds (no gradient) and forward + backward seconds (median of
  ``--repeats``), TFLOP/s by the pairs the rule allows (4 x head_dim FLOPs per pair and head
  forward, 2.5 times that backward), and the largest difference of the output and of dq from the
  default set's (an option that changes the numbers beyond bf16 rounding shows here);
* the cascade tree kernel (``seeupo.llm.tree_attention.cascade_attention``, torch's flash kernel
  per part) on the same tree;
* for scale, torch's dense causal attention (``scaled_dot_product_attention`` with ``is_causal``,
  flash and cuDNN backends where they run) on one sequence with as many allowed pairs.

An option set that cannot compile or run on the device (shared memory, an unsupported key) is
recorded with its error and the run goes on. Each result is appended to ``--out`` as it finishes.
On the CPU (the dry run, ``--device cpu``) only the default set's forward and the cascade kernel
run, at a small shape: flex attention has no backward pass there.

Usage::

    python benchmarks/flex_options.py --device cuda            # on a GPU, about 2 minutes
    python benchmarks/flex_options.py --device cpu --context 100 --turns 1 --group 2 --heads 4 --kv-heads 2 --head-dim 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# name -> flex_attention kernel_options (the fwd_/bwd_ prefixes apply a key to one direction only);
# "default" is torch's own choice for the device (torch/_inductor/template_heuristics/triton.py)
OPTION_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    # every query attends at least to itself in a tree (pad tokens form their own group), so the
    # kernel may skip its guard for fully masked rows
    "rows_safe": {"ROWS_GUARANTEED_SAFE": True},
    "tma": {"USE_TMA": True},
    "prescale": {"PRESCALE_QK": True},
    "fwd_128x128_w8_s2": {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 128, "fwd_num_warps": 8, "fwd_num_stages": 2},
    "fwd_128x64_w4_s3": {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_warps": 4, "fwd_num_stages": 3},
    "fwd_64x128_w4_s3": {"fwd_BLOCK_M": 64, "fwd_BLOCK_N": 128, "fwd_num_warps": 4, "fwd_num_stages": 3},
    "bwd_64x64_w4_s3": {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64,
                        "bwd_num_warps": 4, "bwd_num_stages": 3},
    "bwd_32x128_w4_s3": {"bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 32,
                         "bwd_num_warps": 4, "bwd_num_stages": 3},
    "bwd_64x128_w8_s2": {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 64,
                         "bwd_num_warps": 8, "bwd_num_stages": 2},
}


def build_tree(args: argparse.Namespace, device):
    """``(q, k, v, mask, pairs)``: the packed row of one group at the shape of ``args``."""
    import torch

    from seeupo.llm.tree_attention import attention_pairs, pack_tree, prepared_mask

    rest = args.turns * 350
    rows = args.group
    length = args.context + rest
    ids = torch.zeros(rows, length, dtype=torch.long, device=device)
    packed = pack_tree(ids, torch.full((rows,), length), torch.full((rows,), args.context), torch.zeros(rows, dtype=torch.long),
                       "flex")
    mask = packed.mask
    n = mask.length
    gen = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(1, h, n, args.head_dim, generator=gen, device=device, dtype=dtype)
               for h in (args.heads, args.kv_heads, args.kv_heads))
    return q, k, v, mask, attention_pairs(packed.input_ids, prepared_mask(mask))


def timed(fn: Callable[[], Any], repeats: int, device) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after two warm-up calls."""
    import torch

    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def flops(pairs: int, heads: int, head_dim: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of attention over ``pairs`` allowed pairs."""
    forward = 4.0 * head_dim * heads * pairs
    return forward, 2.5 * forward


def measure_flex(name: str, options: dict, q, k, v, mask, pairs: int, args, device, reference: dict | None) -> dict:
    """One option set: seconds, TFLOP/s and the difference from the default set's results."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    # compiled on CUDA as the policy compiles it; the CPU's dry run calls it eagerly
    compiled = torch.compile(flex_attention, dynamic=True) if device.type == "cuda" else flex_attention
    block_mask = mask.block_mask()
    gqa = q.shape[1] != k.shape[1]
    record: dict[str, Any] = {"event": "flex", "options": name, "kernel_options": options}
    fwd_flops, bwd_flops = flops(pairs, q.shape[1], q.shape[-1])
    with torch.no_grad():
        record["forward_s"] = timed(
            lambda: compiled(q, k, v, block_mask=block_mask, enable_gqa=gqa, kernel_options=dict(options) or None),
            args.repeats, device)
    record["forward_tflops"] = fwd_flops / record["forward_s"] / 1e12
    if device.type != "cuda":  # no backward pass on the CPU
        return record
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    grad_out = torch.randn_like(q)

    def step():
        out = compiled(qg, kg, vg, block_mask=block_mask, enable_gqa=gqa, kernel_options=dict(options) or None)
        out.backward(grad_out)
        return out

    record["forward_backward_s"] = timed(step, args.repeats, device)
    record["backward_s"] = record["forward_backward_s"] - record["forward_s"]
    record["backward_tflops"] = bwd_flops / record["backward_s"] / 1e12 if record["backward_s"] > 0 else None
    for t in (qg, kg, vg):
        t.grad = None
    out = step()
    results = {"out": out.detach(), "dq": qg.grad.detach()}
    if reference is not None:
        record["max_abs_diff_out"] = float((results["out"].float() - reference["out"].float()).abs().max())
        record["max_abs_diff_dq"] = float((results["dq"].float() - reference["dq"].float()).abs().max())
    record["_results"] = results
    return record


def measure_cascade(q, k, v, mask, pairs: int, args, device, reference: dict | None) -> dict:
    """The cascade tree kernel (``seeupo.llm.tree_attention.cascade_attention``: the branches against
    their prefix in one call, each branch causally, merged by log-sum-exp) on the same tree."""
    import torch

    from seeupo.llm.tree_attention import TreeMask, tree_attention

    n = mask.tokens
    cascade = TreeMask(mask.segments[: len(mask.segments) - (mask.length > n)], mask.group[:n], mask.branch[:n], "cascade", n)
    q, k, v = (t[:, :, :n].detach().requires_grad_() for t in (q, k, v))
    grad_out = torch.randn_like(q)
    fwd_flops, bwd_flops = flops(pairs, q.shape[1], q.shape[-1])
    record: dict[str, Any] = {"event": "cascade"}
    with torch.no_grad():
        record["forward_s"] = timed(lambda: tree_attention(q, k, v, cascade, None), args.repeats, device)

    def step():
        out = tree_attention(q, k, v, cascade, None)
        out.backward(grad_out)
        return out

    record["forward_backward_s"] = timed(step, args.repeats, device)
    record["backward_s"] = record["forward_backward_s"] - record["forward_s"]
    record["forward_tflops"] = fwd_flops / record["forward_s"] / 1e12
    record["backward_tflops"] = bwd_flops / record["backward_s"] / 1e12 if record["backward_s"] > 0 else None
    if reference is not None:
        q.grad = None
        out = step()
        record["max_abs_diff_out"] = float((out.float() - reference["out"][:, :, :n].float()).abs().max())
    return record


def measure_dense(backend_name: str, pairs: int, args, device) -> dict:
    """torch's dense causal attention on one sequence with about ``pairs`` allowed pairs."""
    import math

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend_name]
    n = int(math.sqrt(2 * pairs))
    n -= n % 128
    gen = torch.Generator(device=device).manual_seed(1)
    # dense kernels take as many key-value heads as query heads here: the key-values repeated
    q, k, v = (torch.randn(1, args.heads, n, args.head_dim, generator=gen, device=device, dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    grad_out = torch.randn_like(q)
    dense_pairs = n * (n + 1) // 2
    fwd_flops, bwd_flops = flops(dense_pairs, args.heads, args.head_dim)
    record: dict[str, Any] = {"event": "dense", "backend": backend_name, "tokens": n, "pairs": dense_pairs}
    with sdpa_kernel(backend):
        with torch.no_grad():
            record["forward_s"] = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                                        args.repeats, device)

        def step():
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad_out)

        record["forward_backward_s"] = timed(step, args.repeats, device)
    record["backward_s"] = record["forward_backward_s"] - record["forward_s"]
    record["forward_tflops"] = fwd_flops / record["forward_s"] / 1e12
    record["backward_tflops"] = bwd_flops / record["backward_s"] / 1e12 if record["backward_s"] > 0 else None
    return record


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--context", type=int, default=5833, help="the prompt's tokens (BFCL median)")
    p.add_argument("--turns", type=int, default=10, help="turns of 350 tokens in each branch")
    p.add_argument("--group", type=int, default=8, help="branches (rollouts) sharing the prompt")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--options", default=",".join(OPTION_SETS), help="comma-separated names of OPTION_SETS (default always runs, first: the others' differences are from it)")
    p.add_argument("--out", default=str(HERE / "results" / "flex_options.jsonl"))
    args = p.parse_args(argv)
    names = [n for n in args.options.split(",") if n]
    unknown = [n for n in names if n not in OPTION_SETS]
    if unknown or not names:
        print(f"error: --options takes names of {', '.join(OPTION_SETS)}; got {args.options!r}", file=sys.stderr)
        return 2
    sizes = {"--context": args.context, "--turns": args.turns, "--group": args.group, "--heads": args.heads,
             "--kv-heads": args.kv_heads, "--head-dim": args.head_dim, "--repeats": args.repeats}
    small = [f"{flag} {value}" for flag, value in sizes.items() if value < 1]
    if small or args.heads % args.kv_heads:
        why = ", ".join(small) or f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}"
        print(f"error: sizes must be at least 1 and the heads a multiple of the key-value heads; got {why}",
              file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    if device.type != "cuda":
        names = ["default"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    started = time.time()

    def emit(record: dict) -> None:
        record = {k: v for k, v in record.items() if not k.startswith("_")}
        record |= {"device": name, "elapsed_s": round(time.time() - started, 1)}
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)

    q, k, v, mask, pairs = build_tree(args, device)
    emit({"event": "setup", "tokens": mask.tokens, "length": mask.length, "pairs": pairs, "heads": args.heads,
          "kv_heads": args.kv_heads, "head_dim": args.head_dim, "torch": torch.__version__})
    # the differences are taken from the default set's results: it runs first
    names = ["default"] + [n for n in names if n != "default"]
    reference: dict | None = None
    failed, errors = 0, 0  # failed: the default flex set or the cascade kernel; errors: any record
    for option_name in names:
        try:
            record = measure_flex(option_name, OPTION_SETS[option_name], q, k, v, mask, pairs, args, device, reference)
            if option_name == "default":
                reference = record.get("_results")
        except Exception as error:  # an option set the device cannot run is a result too
            record = {"event": "flex", "options": option_name, "error": f"{type(error).__name__}: {str(error)[:300]}"}
            failed += option_name == "default"
            errors += 1
        emit(record)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    try:
        emit(measure_cascade(q, k, v, mask, pairs, args, device, reference))
    except Exception as error:
        emit({"event": "cascade", "error": f"{type(error).__name__}: {str(error)[:300]}"})
        failed, errors = failed + 1, errors + 1
    if device.type == "cuda":
        for backend in ("flash", "cudnn"):
            try:
                emit(measure_dense(backend, pairs, args, device))
            except Exception as error:
                emit({"event": "dense", "backend": backend, "error": f"{type(error).__name__}: {str(error)[:300]}"})
                errors += 1
    emit({"event": "done", "failed": failed, "errors": errors})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
