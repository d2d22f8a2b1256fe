"""Peak memory of one policy update with and without micro-batching (issue 9 §6).

Each configuration runs in its own subprocess (a process's peak RSS never goes down) and
reports ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` twice: after the set-up (model, reference
log-probabilities of the batch, optimizer) and after one :func:`policy_update`. torch's CPU
allocations do not show in ``tracemalloc``; the peak RSS does. The update is GRPO with one
epoch and one minibatch, so the whole batch is one optimizer step: without micro-batching its
forward graph is held for all rows at once; with ``micro_batch_rows=k`` for ``k`` rows at a
time (the gradient is the same, see :func:`seeupo.core.update.policy_update`).

Usage::

    python benchmarks/peak_memory.py [--model smollm2-135m --traj 8 --turns 2 --context 100 --response 16 --micro 0 4 1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, str(HERE))
    from update_time import synthetic_batch

    from seeupo.core.config import preset
    from seeupo.core.update import UpdateSettings, compute_advantages, policy_update
    from seeupo.llm.policy import CausalLMPolicy
    from seeupo.llm.build import load_model

    torch.set_num_threads(1)
    model, tokenizer = load_model(args.model, "float32", 0)
    batch = synthetic_batch(tokenizer, min(model.config.vocab_size, len(tokenizer)), args.traj, args.turns, args.context,
                            args.response, args.group, 0)
    policy = CausalLMPolicy(model, temperature=0.9)
    with torch.no_grad():
        logp = policy.token_logps(batch)
    batch = batch.with_updates(logp_old=logp)
    cfg = preset("grpo", group_size=args.group, kl_coef=0.002)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    adv = compute_advantages(batch, cfg)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    micro = args.child_micro or None
    start = time.perf_counter()
    policy_update(policy, opt, batch, adv, cfg, UpdateSettings(logp_ref=logp, micro_batch_rows=micro, max_grad_norm=1.0))
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"micro_batch_rows": micro, "rows": batch.num_rows,
                      "tokens": int(batch.data["attention_mask"].sum()),
                      "maxrss_after_setup_mib": before / 1024, "maxrss_after_update_mib": after / 1024,
                      "update_seconds": seconds, "load_average_1min": os.getloadavg()[0]}))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--traj", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--context", type=int, default=100)
    p.add_argument("--response", type=int, default=16)
    p.add_argument("--micro", type=int, nargs="*", default=[0, 4, 1], help="micro_batch_rows values (0: none)")
    p.add_argument("--child-micro", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    if args.child_micro is not None:
        child(args)
        return {}
    results = []
    base = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--no-record")]
    for micro in args.micro:
        cmd = [sys.executable, __file__, *_strip_micro(base), "--child-micro", str(micro)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
        results.append(json.loads(line))
        print(line, flush=True)
    record = {"timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "script": "peak_memory.py",
              "settings": {k: v for k, v in vars(args).items() if k != "child_micro"}, "results": results,
              "cpu_count": os.cpu_count()}
    if not args.no_record:
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "peak_memory.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _strip_micro(argv: list[str]) -> list[str]:
    """``argv`` without ``--micro`` and its values."""
    out, skipping = [], False
    for a in argv:
        if a == "--micro":
            skipping = True
            continue
        if skipping and not a.startswith("--"):
            continue
        skipping = False
        out.append(a)
    return out


if __name__ == "__main__":
    main()
