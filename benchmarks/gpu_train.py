"""Training throughput, model FLOPs utilisation, peak memory and SeeUPO/GRPO update time of real model shapes.

A randomly initialised model of a real architecture (``--shape qwen3-1.7b`` or ``qwen3-8b``: the
configs of Qwen3-1.7B and Qwen3-8B, no weights needed; ``tiny`` for a CPU check of the script)
is wrapped exactly as ``torchrun -m seeupo train`` wraps it (FSDP2 over the processes, one
process unless launched by torchrun; bf16 mixed precision over float32 master weights on CUDA;
optional activation checkpointing), and timed on a synthetic multi-turn batch
(``benchmarks/update_time.py``'s: growing contexts, ``--turns`` turns per trajectory):

* **training tokens/s**: one GRPO update (1 epoch x 1 minibatch: every row through one
  forward and backward pass, micro-batches of ``--micro-batch-tokens``), tokens = context +
  response tokens of every row;
* **MFU**: model FLOPs / time / the device's dense bf16 peak. Model FLOPs per update =
  ``6 * (non-embedding parameters) * tokens + 6 * hidden * vocab * response tokens`` (the
  policy computes logits only at response positions) ``+ 6 * layers * hidden * sum(len^2)``
  (causal attention, forward + backward); activation recomputation is not counted;
* **peak memory**: ``torch.cuda.max_memory_allocated`` (CUDA) or the process's peak RSS (CPU);
* **SeeUPO/GRPO update time at equal tokens**: GRPO's update against SeeUPO's sequential sweep
  (each turn's rows through one forward and backward pass, plus the no-grad ratio pass of every
  turn but the last for ``M``, as the trainer runs it), interleaved within each repeat;
* **HF generate tokens/s**: :class:`seeupo.llm.rollout.HFGenerateEngine` on a bf16 copy.

Results go to ``benchmarks/results/gpu_train_<shape>_<device>.json``; add a line to
``benchmarks/RESULTS.md`` by hand with the device named. Usage::

    python benchmarks/gpu_train.py --shape qwen3-1.7b --traj 32 --context 2048 --response 512 --turns 2
    torchrun --nproc-per-node 8 benchmarks/gpu_train.py --shape qwen3-8b ...
    python benchmarks/gpu_train.py --shape tiny --traj 16 --context 128 --response 32   # CPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from update_time import synthetic_batch  # noqa: E402

# the shapes of the released configs (config.json of Qwen/Qwen3-1.7B and Qwen/Qwen3-8B)
SHAPES = {
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=True),
}
# dense bf16 peak FLOP/s (no sparsity), by a substring of torch.cuda.get_device_name()
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


def model_flops(config, batch) -> float:
    """Model FLOPs of one forward + backward pass of every row of ``batch`` (see the module docstring)."""
    lengths = batch.data["attention_mask"].sum(1).to(torch.float64)
    tokens = float(lengths.sum())
    response = float(batch.token_mask.sum())
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    inter, heads, kv, hd = config.intermediate_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    per_layer = d * heads * hd + 2 * d * kv * hd + heads * hd * d + 3 * d * inter  # q, k, v, o, gate/up/down
    dense = 6.0 * layers * per_layer * tokens
    head = 6.0 * d * vocab * response
    attention = 6.0 * layers * heads * hd * float((lengths**2).sum())
    return dense + head + attention


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> dict:
    from transformers import AutoModelForCausalLM, Qwen3Config

    from seeupo.core.config import preset
    from seeupo.core.parallel import owner_scored, score_rows
    from seeupo.core.update import UpdateSettings, compute_advantages, final_factor, policy_update
    from seeupo.llm.distributed import (
        enable_activation_checkpointing, init_distributed, launched_by_torchrun, rollout_replica, shard_model, shutdown,
    )
    from seeupo.llm.models import train_bpe_tokenizer
    from seeupo.llm.policy import CausalLMPolicy
    from seeupo.llm.rollout import HFGenerateEngine, SamplingParams

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b")
    p.add_argument("--traj", type=int, default=32, help="trajectories (groups of 8), each of --turns rows")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--context", type=int, default=2048, help="first turn's context tokens")
    p.add_argument("--response", type=int, default=512)
    p.add_argument("--micro-batch-tokens", type=int, default=16384)
    p.add_argument("--micro-batch-rows", type=int, default=4, help="rows forwarded per pass (scoring and update)")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gen-prompts", type=int, default=32)
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--final-factor", action="store_true",
                   help="also compute M's last factor (the trainer's logging.m_final); by default skipped, as in training")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)

    if not launched_by_torchrun():  # one process: a process group of one, as `torchrun --nproc-per-node 1`
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
    env = init_distributed()
    device = env.device
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    config = Qwen3Config(**SHAPES[args.shape], max_position_embeddings=65536)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    n_params = sum(p.numel() for p in model.parameters())
    replica = rollout_replica(model, device, torch.bfloat16 if cuda else None)
    if args.activation_checkpointing:
        enable_activation_checkpointing(model)
    shard_model(model, env, mixed_precision="bf16" if cuda else "none")
    policy = CausalLMPolicy(model, temperature=0.9, micro_batch_rows=args.micro_batch_rows, collective=env.dp)
    tokenizer = train_bpe_tokenizer()
    batch = synthetic_batch(tokenizer, config.vocab_size, args.traj, args.turns, args.context, args.response, 8, 0)
    with torch.no_grad():
        logp = score_rows(policy.token_logps, batch, env.dp)
    batch = batch.with_updates(logp_old=logp)
    row_tokens = batch.data["attention_mask"].sum(1)
    cfgs = {name: preset(name, group_size=8, epochs=1, minibatches=1, kl_coef=0.002) for name in ("grpo", "seeupo")}
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-7)  # a tiny lr: the weights barely move between repeats
    times: dict[str, list[float]] = {name: [] for name in cfgs}
    for r in range(args.repeats + 1):  # repeat 0 warms up (allocator, kernels) and is not counted
        for name, cfg in cfgs.items():
            adv = compute_advantages(batch, cfg)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            sync(device)
            start = time.perf_counter()
            stats = policy_update(policy, optimizer, batch, adv, cfg, UpdateSettings(
                logp_ref=logp, generator=torch.Generator().manual_seed(r), micro_batch_tokens=args.micro_batch_tokens,
                row_tokens=row_tokens, max_grad_norm=1.0, dp=env.dp,
            ))
            if args.final_factor:  # what the trainer adds for logging.m_final
                final_factor(owner_scored(policy, env.dp), batch, cfg, stats)
            sync(device)
            if r > 0:
                times[name].append(time.perf_counter() - start)
        if env.is_main and r > 0:
            print(f"repeat {r}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()), flush=True)
    peak = peak_memory_bytes(device)
    grpo_s = statistics.median(times["grpo"])
    tokens = float(row_tokens.sum())
    flops = model_flops(config, batch)
    world = env.dp.world_size
    name = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    peak_flops = next((v for k, v in PEAK_BF16.items() if k in name), None) if cuda else None

    gen = HFGenerateEngine(replica, tokenizer.pad_token_id or 0)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, config.vocab_size, (args.context,), generator=g).tolist() for _ in range(args.gen_prompts)]
    params = SamplingParams(temperature=0.9, max_new_tokens=args.gen_tokens, stop_token_ids=(), seed=0)
    sync(device)
    start = time.perf_counter()
    out = gen.generate(prompts, 1, params)
    sync(device)
    gen_s = time.perf_counter() - start
    generated = sum(len(c[0].token_ids) for c in out)

    ratios = [s / g_ for s, g_ in zip(times["seeupo"], times["grpo"])]
    result = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "script": "gpu_train.py",
        "settings": vars(args), "device": name, "processes": world, "parameters": n_params,
        "rows": batch.num_rows, "tokens_per_update": tokens, "response_tokens": int(batch.token_mask.sum()),
        "seconds": times, "median_seconds": {k: statistics.median(v) for k, v in times.items()},
        "training_tokens_per_s": tokens / grpo_s, "training_tokens_per_s_per_device": tokens / grpo_s / world,
        "model_flops_per_update": flops, "model_tflops_per_s_per_device": flops / grpo_s / world / 1e12,
        "mfu": (flops / grpo_s / world / peak_flops) if peak_flops else None,
        "peak_memory_gib": peak / 2**30,
        "ratio_seeupo_over_grpo": ratios, "median_ratio_seeupo_over_grpo": statistics.median(ratios),
        "generate_tokens_per_s": generated / gen_s, "generate_prompts": args.gen_prompts,
        "generate_new_tokens": generated, "torch": torch.__version__, "load_average_1min": os.getloadavg()[0],
    }
    if env.is_main:
        print(json.dumps({k: v for k, v in result.items() if k != "seconds"}, indent=1))
        if not args.no_record:
            (HERE / "results").mkdir(exist_ok=True)
            tag = "cuda" if cuda else "cpu"
            (HERE / "results" / f"gpu_train_{args.shape}_{tag}.json").write_text(json.dumps(result, indent=1) + "\n")
    shutdown()
    return result


if __name__ == "__main__":
    main()
