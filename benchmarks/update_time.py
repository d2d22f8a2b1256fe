"""SeeUPO vs GRPO *update* time at equal tokens (issue 9 §6).

Only :func:`seeupo.core.update.policy_update` is timed: the rollout batch is built once, a
synthetic multi-turn batch of realistic shape (``--traj`` trajectories in groups of 8, ``--turns``
turns, the turn-``t`` context ``--context + t * (--response + 12)`` tokens of random ids, responses
of ``--response`` tokens, 0/1 rewards), with ``logp_old`` and ``logp_ref`` computed once by the
model itself (ratios start at 1, as after a real rollout). Each update starts from the same
weights and a fresh AdamW, so every configuration does the same work in every repeat.

Configurations (the same ``epochs x minibatches``):

* ``grpo``: one simultaneous update, ``epochs x minibatches`` optimizer steps on all rows;
* ``seeupo``: the sequential sweep, ``epochs x minibatches`` steps *per turn* on that turn's rows
  (the same tokens through forward/backward in total) plus one no-grad ratio pass per turn for M;
* ``seeupo_equal_budget``: ``equal_budget=True`` (the simultaneous update's number of optimizer
  steps, shared by the turns).

The configurations are interleaved within each repeat (same load) and the ratio
SeeUPO/GRPO is reported per repeat and as the median. One intra-op thread.

Usage::

    python benchmarks/update_time.py --model tiny-qwen3 [--traj 64 --turns 3 --context 200 --response 32 --repeats 5]
    python benchmarks/update_time.py --model smollm2-135m --traj 16 --turns 2 --context 100 --response 16 --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def synthetic_batch(tokenizer, vocab: int, traj: int, turns: int, context: int, response: int, group: int, seed: int):
    """A multi-turn LM batch: trajectory-major rows, growing contexts (each turn appends its response and an observation)."""
    from seeupo.core.batch import SampleBatch
    from seeupo.llm.layout import pack_rows

    g = torch.Generator().manual_seed(seed)
    low = len(tokenizer.all_special_ids) + 3  # skip the special ids at the start of the vocabularies used here
    contexts, responses = [], []
    for _ in range(traj):
        ctx = torch.randint(low, vocab, (context,), generator=g).tolist()
        for _t in range(turns):
            resp = torch.randint(low, vocab, (response,), generator=g).tolist()
            contexts.append(list(ctx))
            responses.append(resp)
            ctx = ctx + resp + torch.randint(low, vocab, (12,), generator=g).tolist()  # the observation message
    n = traj * turns
    reward = torch.zeros(n, dtype=torch.float32)
    ret = (torch.rand(traj, generator=g) < 0.5).to(torch.float32)
    rep = lambda x: x.repeat_interleave(turns)  # noqa: E731
    reward[turns - 1 :: turns] = ret
    return SampleBatch(
        traj_id=rep(torch.arange(traj)), group_id=rep(torch.arange(traj) // group), turn=torch.arange(turns).repeat(traj),
        logp_old=torch.zeros(n, response), token_mask=torch.ones(n, response, dtype=torch.bool),
        valid=torch.ones(n, dtype=torch.bool), reward=reward, traj_return=rep(ret), weight=torch.ones(n),
        instance=torch.zeros(n, dtype=torch.long), data=pack_rows(contexts, responses, tokenizer.pad_token_id or 0),
    )


def configs(epochs: int, minibatches: int, group: int):
    from seeupo.core.config import preset

    common = dict(group_size=group, epochs=epochs, minibatches=minibatches, kl_coef=0.002)
    return {
        "grpo": preset("grpo", **common),
        "seeupo": preset("seeupo", **common),
        "seeupo_equal_budget": preset("seeupo", equal_budget=True, **common),
    }


def main(argv: list[str] | None = None) -> dict:
    from seeupo.core.update import UpdateSettings, compute_advantages, policy_update
    from seeupo.llm.policy import CausalLMPolicy
    from seeupo.llm.build import load_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-qwen3")
    p.add_argument("--traj", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--response", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--minibatches", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--micro-batch-rows", type=int, default=8, help="rows forwarded per pass (scoring and update)")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    model, tokenizer = load_model(args.model, "float32", 0)
    vocab = model.config.vocab_size
    batch = synthetic_batch(tokenizer, min(vocab, len(tokenizer)), args.traj, args.turns, args.context, args.response,
                            args.group, 0)
    policy = CausalLMPolicy(model, temperature=0.9, micro_batch_rows=args.micro_batch_rows)
    with torch.no_grad():
        logp = policy.token_logps(batch)
    batch = batch.with_updates(logp_old=logp)
    initial = copy.deepcopy(model.state_dict())
    cfgs = configs(args.epochs, args.minibatches, args.group)
    times: dict[str, list[float]] = {k: [] for k in cfgs}
    steps: dict[str, int] = {}
    loads = []
    for r in range(args.repeats):
        for name, cfg in cfgs.items():
            model.load_state_dict(initial)
            opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
            adv = compute_advantages(batch, cfg)
            start = time.perf_counter()
            stats = policy_update(policy, opt, batch, adv, cfg, UpdateSettings(
                logp_ref=logp, generator=torch.Generator().manual_seed(r), max_grad_norm=1.0))
            times[name].append(time.perf_counter() - start)
            steps[name] = stats.steps
        loads.append(os.getloadavg()[0])
        print(f"repeat {r}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()) + f" (load {loads[-1]:.2f})",
              flush=True)
    ratio = [s / g for s, g in zip(times["seeupo"], times["grpo"])]
    ratio_eq = [s / g for s, g in zip(times["seeupo_equal_budget"], times["grpo"])]
    tokens = int((batch.data["attention_mask"].sum()))
    result = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "script": "update_time.py", "settings": vars(args), "model": args.model, "rows": batch.num_rows,
        "tokens_per_forward_pass_of_the_batch": tokens, "response_tokens": int(batch.token_mask.sum()),
        "optimizer_steps": steps, "seconds": times,
        "median_seconds": {k: statistics.median(v) for k, v in times.items()},
        "ratio_seeupo_over_grpo": ratio, "median_ratio_seeupo_over_grpo": statistics.median(ratio),
        "ratio_seeupo_equal_budget_over_grpo": ratio_eq,
        "median_ratio_seeupo_equal_budget_over_grpo": statistics.median(ratio_eq),
        "load_average_1min": loads, "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "platform": platform.platform(),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "seconds"}, indent=1))
    if not args.no_record:
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / f"update_time_{args.model}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
