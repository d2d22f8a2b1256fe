"""Peak memory of token log-probabilities per path: reference vs chunked vs liger (issue 24 §1).

One scoring pass (no grad: the old-policy and reference log-probabilities) and one update pass
(forward and backward of ``sum(g * logp)``, the head's weight and the hidden states requiring
grad) of :mod:`seeupo.llm.logprobs` at the BFCL shape: ``--rows`` read positions (default
12,000: about 8 rollouts x 10 turns x 150 response tokens), Qwen3-1.7B's hidden size 2,048 and
Qwen3's real vocabulary of 151,936. The numbers are the log-prob part alone: the backbone's
activations are not built.

CUDA: all passes in this process; each is measured as ``torch.cuda.max_memory_allocated()`` over
the pass minus the memory allocated before it (the inputs, ``hidden [N, H]``, ``weight [V, H]``,
``target [N]``), after one unmeasured warm-up pass on 64 rows (so that its seconds are not the
first call's). CPU: each (path, pass) runs in its own subprocess (a process's peak RSS never goes
down) and reports ``ru_maxrss`` after the pass minus ``ru_maxrss`` after allocating the inputs,
with no warm-up. The update pass's peak includes the gradients it leaves (``weight.grad``,
``hidden.grad``: the same for every path, shown apart). Each pass also checks that its
log-probabilities match the reference's (their mean).

Usage::

    python benchmarks/logprob_memory.py --device cuda --dtype bfloat16           # the real shape, on a GPU
    python benchmarks/logprob_memory.py --device cpu --rows 2048 --hidden 256    # a few GB on a CPU

Prints a table and the peak ratio reference / chunked, and appends one JSON record (a line) to
``--out`` (default ``benchmarks/results/logprob_memory.jsonl``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PASSES = ("score", "update")


def make_inputs(args: argparse.Namespace, device, requires_grad: bool):
    """``(hidden, weight, target, g)``: random inputs whose logits have unit spread, made in place in
    ``args.dtype`` (no float32 temporary, which would raise the CPU's peak RSS before the pass)."""
    import torch

    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(args.rows, args.hidden, generator=gen, dtype=dtype, device=device)
    weight = torch.randn(args.vocab, args.hidden, generator=gen, dtype=dtype, device=device)
    weight.mul_(args.hidden ** -0.5)
    target = torch.randint(args.vocab, (args.rows,), generator=gen, device=device)
    g = torch.randn(args.rows, generator=gen, dtype=torch.promote_types(dtype, torch.float32), device=device)
    return hidden.requires_grad_(requires_grad), weight.requires_grad_(requires_grad), target, g


def run_pass(args: argparse.Namespace, path: str, kind: str, hidden, weight, target, g) -> tuple[float, float]:
    """Run one ``kind`` pass of ``path``: ``(seconds, mean log-probability)``."""
    import torch

    from seeupo.llm.logprobs import logprob_backend

    fn = logprob_backend(path, hidden.device)
    kwargs = {"chunk_rows": args.chunk_rows} if path == "chunked" and args.chunk_rows else {}
    start = time.perf_counter()
    if kind == "score":
        with torch.no_grad():
            logp = fn(hidden, weight, target, args.temperature, **kwargs)
    else:
        logp = fn(hidden, weight, target, args.temperature, **kwargs)
        (g * logp).sum().backward()
    mean = float(logp.detach().double().mean())
    if hidden.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, mean


def grads_mib(hidden, weight) -> float:
    """MiB of the gradients a pass leaves behind (``hidden.grad``, ``weight.grad``; 0 after a scoring pass)."""
    return sum(x.grad.numel() * x.grad.element_size() for x in (hidden, weight) if x.grad is not None) / 2**20


def child(args: argparse.Namespace) -> None:
    """CPU: one (path, pass) in this process, its peak RSS over the pass printed as JSON."""
    import torch

    path, kind = args.child.split(":")
    hidden, weight, target, g = make_inputs(args, "cpu", kind == "update")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    seconds, mean = run_pass(args, path, kind, hidden, weight, target, g)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"path": path, "pass": kind, "peak_mib": (after - before) / 1024, "seconds": seconds,
                      "logp_mean": mean, "grads_mib": grads_mib(hidden, weight), "rss_before_mib": before / 1024,
                      "torch_threads": torch.get_num_threads()}))


def measure_cpu(args: argparse.Namespace, argv: list[str]) -> list[dict]:
    results = []
    for path in args.paths:
        for kind in PASSES:
            cmd = [sys.executable, __file__, *argv, "--child", f"{path}:{kind}"]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True)
            results.append(json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]))
            print(f"  {path:9s} {kind:6s} done ({results[-1]['seconds']:.1f} s)", flush=True)
    return results


def measure_cuda(args: argparse.Namespace) -> list[dict]:
    import torch

    results = []
    for path in args.paths:
        for kind in PASSES:
            hidden, weight, target, g = make_inputs(args, "cuda", kind == "update")
            # a warm-up pass (cuBLAS's workspace, Triton's compilation), not measured; its gradients dropped
            run_pass(args, path, kind, hidden[:64], weight, target[:64], g[:64])
            hidden.grad = weight.grad = None
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            try:
                seconds, mean = run_pass(args, path, kind, hidden, weight, target, g)
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            except torch.cuda.OutOfMemoryError as err:
                seconds, mean, peak = float("nan"), float("nan"), float("nan")
                print(f"  {path} {kind}: out of memory ({str(err).splitlines()[0]})", flush=True)
            results.append({"path": path, "pass": kind, "peak_mib": peak, "seconds": seconds, "logp_mean": mean,
                            "grads_mib": grads_mib(hidden, weight), "allocated_before_mib": base / 2**20})
            del hidden, weight, target, g
            torch.cuda.empty_cache()
    return results


def cpu_name() -> str:
    """The processor's model name (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def default_paths(device: str) -> list[str]:
    from seeupo.llm.logprobs import liger_unavailable

    return ["reference", "chunked"] + (["liger"] if liger_unavailable(device) is None else [])


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available, else cpu")
    p.add_argument("--rows", type=int, default=12_000, help="read positions N (default: the BFCL shape)")
    p.add_argument("--hidden", type=int, default=2048, help="hidden size H (default: Qwen3-1.7B)")
    p.add_argument("--vocab", type=int, default=151_936, help="vocabulary V (default: Qwen3's)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32", "float64"], default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--paths", nargs="+", choices=["reference", "chunked", "liger"], default=None,
                   help="default: reference chunked, and liger where it can run")
    p.add_argument("--chunk-rows", type=int, default=None, help="chunked path's rows per chunk (default: its own)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--out", type=Path, default=HERE / "results" / "logprob_memory.jsonl",
                   help="append the JSON record (one line) to this file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.paths = args.paths or default_paths(args.device)
    if args.child is not None:
        child(args)
        return {}
    from seeupo.llm.logprobs import default_chunk_rows

    chunk_rows = args.chunk_rows or default_chunk_rows(args.vocab)
    print(f"N={args.rows:,} H={args.hidden:,} V={args.vocab:,} {args.dtype} on {args.device}, chunk_rows={chunk_rows}, "
          f"temperature {args.temperature}; one [N, V] float32 tensor = {args.rows * args.vocab * 4 / 2**20:,.0f} MiB",
          flush=True)
    start = time.perf_counter()
    results = measure_cuda(args) if args.device == "cuda" else measure_cpu(args, argv)
    by = {(r["path"], r["pass"]): r for r in results}
    print("\n| path | pass | peak MiB over the inputs | of which gradients left | seconds | mean logp |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['path']} | {r['pass']} | {r['peak_mib']:,.0f} | {r['grads_mib']:,.0f} | {r['seconds']:.2f} "
              f"| {r['logp_mean']:.6f} |")
    ratios = {}
    for kind in PASSES:
        ref, fast = by.get(("reference", kind)), by.get(("chunked", kind))
        if ref and fast and fast["peak_mib"] > 0:
            ratios[kind] = ref["peak_mib"] / fast["peak_mib"]
            # the working memory alone: the gradients left are the same for every path
            ratios[f"{kind}_without_grads"] = ((ref["peak_mib"] - ref["grads_mib"])
                                               / max(fast["peak_mib"] - fast["grads_mib"], 1e-9))
            print(f"reference / chunked peak, {kind}: x{ratios[kind]:.1f} "
                  f"(without the gradients left: x{ratios[kind + '_without_grads']:.1f})")
    # every path must give the reference's numbers: their means agree to float32 rounding
    ref_mean = by.get(("reference", "score"), {}).get("logp_mean")
    gaps = {f"{r['path']}:{r['pass']}": abs(r["logp_mean"] - ref_mean) for r in results if ref_mean is not None}
    if gaps:
        print(f"largest |mean logp - reference's|: {max(gaps.values()):.2e}")
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else cpu_name()
    record = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "script": "logprob_memory.py",
        "device": args.device, "device_name": device_name, "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "rows": args.rows, "hidden": args.hidden, "vocab": args.vocab, "dtype": args.dtype, "chunk_rows": chunk_rows,
        "temperature": args.temperature, "results": results, "ratio_reference_over_chunked": ratios,
        "logp_mean_gap": gaps, "wall_seconds": time.perf_counter() - start,
        "load_average_1min": os.getloadavg()[0],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"appended to {args.out} ({record['wall_seconds']:.1f} s)")
    return record


if __name__ == "__main__":
    main()
