"""HF engine decoding throughput at the paper's shape: the reference (dynamic) cache against the static one.

A randomly initialised Qwen3 of a released shape (``--shape qwen3-1.7b``, ``gpu_train.SHAPES``; no
weights needed), in bf16 on CUDA, samples ``--prompts`` random-id prompts of about
``--prompt-len`` tokens (lengths ``prompt_len - 16 i``, so rows are left-padded) x ``--n``
completions each (batch 32 by default) of ``--new-tokens`` tokens at temperature 1, with no stop
tokens (every row runs to the end). :class:`seeupo.llm.rollout.HFGenerateEngine` runs it with:

* ``dynamic``: ``cache="dynamic"``, Hugging Face ``generate`` (the reference path);
* ``static-eager``: ``cache="static", cuda_graph=False``: preallocated key/values, the decode step run eagerly;
* ``static-graph``: ``cache="static"``: the same, its decode step captured once as a CUDA graph (CUDA only).

Each path: one warm-up call (its time is reported: for ``static-graph`` it holds the graph
capture), then ``--repeats`` timed calls; tokens/s = new tokens / the call's wall time, which also
holds the prefill (each prompt's ``prompt_len - 1`` tokens forwarded once, shared by its ``n``
rows). Every path samples with the same seed; ``same_tokens`` is the share of rows whose tokens
equal the dynamic path's (1.0 in float32 on the CPU, tested; in bf16 the paths' different
attention lengths round differently and a row that draws one other token then diverges).
One JSON line per path is printed and appended to ``--out`` as soon as it is measured.

    python benchmarks/generation_gpu.py --out gen.jsonl                      # H100: Qwen3-1.7B, bf16
    python benchmarks/generation_gpu.py --shape tiny --device cpu --out /tmp/gen.jsonl   # CPU dry run
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
PATHS = {  # name: HFGenerateEngine keyword arguments
    "dynamic": dict(cache="dynamic"),
    "static-eager": dict(cache="static", cuda_graph=False),
    "static-graph": dict(cache="static", cuda_graph=True),
}


def build_model(shape: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A random-weight Qwen3 of ``shape``, initialised on ``device`` (a 1.7B init on the CPU would eat the time budget)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    sys.path.insert(0, str(HERE))
    from gpu_train import SHAPES

    torch.manual_seed(0)
    config = Qwen3Config(**SHAPES[shape], max_position_embeddings=65536)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> list[dict]:
    import transformers

    from seeupo.llm.rollout import HFGenerateEngine, SamplingParams

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen3-1.7b", help="a gpu_train.SHAPES key (tiny for the CPU dry run)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--n", type=int, default=8, help="completions per prompt (batch = prompts x n)")
    p.add_argument("--prompt-len", type=int, default=1000)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1,
                   help="timed calls per path, after one warm-up call (1: the GPU run fits in 90 s)")
    p.add_argument("--paths", default=None,
                   help=f"comma-separated, of {sorted(PATHS)} (default: all; no graph on the CPU)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads on the CPU (1: no threads waiting on each other on a shared machine)")
    p.add_argument("--out", default=None, help="append one JSON line per path to this file")
    args = p.parse_args(argv)

    start_all = time.perf_counter()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if cuda else torch.float32)
    paths = args.paths.split(",") if args.paths else [k for k in PATHS if cuda or k != "static-graph"]
    model = build_model(args.shape, dtype, device)
    sync(device)
    build_s = time.perf_counter() - start_all
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, vocab, (args.prompt_len - 16 * i,), generator=g).tolist() for i in range(args.prompts)]
    batch = args.prompts * args.n
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, stop_token_ids=(), seed=0)
    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"{args.shape} {dtype} on {device_name}: built in {build_s:.1f} s; batch {batch} "
          f"({args.prompts} prompts of {len(prompts[-1])}-{len(prompts[0])} tokens x {args.n}), "
          f"{args.new_tokens} new tokens", flush=True)

    records, reference = [], None
    for name in paths:
        # reuse_contexts=False: each call starts afresh (a kept context would make later calls
        # prefill nothing); max_batch_size: the whole batch in one call
        engine = HFGenerateEngine(model, 0, max_batch_size=batch, reuse_contexts=False, **PATHS[name])
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        t0 = time.perf_counter()
        out = engine.generate(prompts, args.n, params)
        sync(device)
        warmup_s = time.perf_counter() - t0
        seconds = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = engine.generate(prompts, args.n, params)
            sync(device)
            seconds.append(time.perf_counter() - t0)
        rows = [c.token_ids for group in out for c in group]
        reference = rows if reference is None and name == "dynamic" else reference
        tokens = sum(len(r) for r in rows)
        best = min(seconds) if seconds else warmup_s
        record = {
            "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "script": "generation_gpu.py",
            "path": name, "shape": args.shape, "dtype": str(dtype).removeprefix("torch."), "device": device_name,
            "batch": batch, "prompts": args.prompts, "n": args.n, "prompt_lengths": [len(q) for q in prompts],
            "new_tokens": tokens, "warmup_s": warmup_s, "seconds": seconds, "tokens_per_s": tokens / best,
            "cuda_graph_used": bool(engine._static is not None and engine._static.graph is not None),
            "same_tokens": (sum(a == b for a, b in zip(rows, reference)) / len(rows)) if reference else None,
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
            "elapsed_s": time.perf_counter() - start_all, "torch": torch.__version__,
            "transformers": transformers.__version__,
            "load_average_1min": os.getloadavg()[0],
        }
        records.append(record)
        print(json.dumps(record), flush=True)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(record) + "\n")
        del engine, out
    return records


if __name__ == "__main__":
    main()
