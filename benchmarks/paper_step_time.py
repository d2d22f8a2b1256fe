"""Step time of the paper's setting, estimated on paper from measured figures (issue 11).

The paper's setting (docs/method.md §4): Qwen3-14B, 32 tasks x 8 rollouts per step, at most 10 turns,
8 GPUs; it reports SeeUPO's step at 1.2-1.9x GRPO's. The estimate splits a step into

* ``gen``: sampling, ``generated tokens / (generation tokens/s per GPU x GPUs)``;
* ``score``: the no-grad passes of the policy (``logp_old``) and the reference (KL): two forward
  passes of every row, each a third of a training pass (forward 2 FLOPs per parameter and
  token, backward 4);
* ``update``: one forward + backward pass of every row (the reference code's 1 epoch x 1
  minibatch), ``model FLOPs / (MFU x peak x GPUs)``; SeeUPO's update is GRPO's times the
  **measured** update-time ratio at equal tokens (``benchmarks/gpu_train.py``: the extra no-grad
  ratio pass per turn for ``M`` and one optimizer step per turn).

Token shapes: the first-turn context is the median BFCL multi_turn_base prompt that we measured
(``paper_repro/bfcl/prompt_lengths.json``, json format, training split); each turn adds a response
of ``--response`` and an observation of ``--observation`` tokens (our assumptions, flags), every
episode runs ``--turns`` turns. The MFU and generation rate come from a ``gpu_train.py`` result
on a GPU when one is given; without one they are flags, and the output says that they are assumed.

Usage::

    python benchmarks/paper_step_time.py --measured benchmarks/results/gpu_train_qwen3-8b_cuda.json
    python benchmarks/paper_step_time.py --ratio 1.37 --mfu 0.3 --gen-tokens-per-s 2000   # assumed rates
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Qwen3-14B (config.json of Qwen/Qwen3-14B)
QWEN3_14B = dict(hidden=5120, inter=17408, layers=40, heads=40, kv=8, head_dim=128, vocab=151936)
PEAK_BF16_H100 = 989.4e12


def step_tokens(context0: int, response: int, observation: int, turns: int, trajectories: int) -> dict[str, float]:
    """Tokens of one step: rows forwarded (context + response), their squares (attention), generated tokens."""
    lengths = [context0 + t * (response + observation) + response for t in range(turns)]
    return {"forwarded": trajectories * sum(lengths), "squares": trajectories * sum(x * x for x in lengths),
            "response": trajectories * turns * response, "generated": trajectories * turns * response}


def train_flops(shape: dict[str, int], tokens: dict[str, float]) -> float:
    """Model FLOPs of one forward + backward pass of every row (benchmarks/gpu_train.py's count)."""
    s = shape
    per_layer = s["hidden"] * s["heads"] * s["head_dim"] * 2 + 2 * s["hidden"] * s["kv"] * s["head_dim"] + 3 * s["hidden"] * s["inter"]
    return (6.0 * s["layers"] * per_layer * tokens["forwarded"] + 6.0 * s["hidden"] * s["vocab"] * tokens["response"]
            + 6.0 * s["layers"] * s["heads"] * s["head_dim"] * tokens["squares"])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measured", type=Path, help="a gpu_train.py result (its ratio, MFU and generation rate)")
    p.add_argument("--ratio", type=float, help="SeeUPO/GRPO update time at equal tokens (default: the measured one)")
    p.add_argument("--mfu", type=float, help="model FLOPs utilisation of the update (default: the measured one)")
    p.add_argument("--gen-tokens-per-s", type=float, help="generation tokens/s per GPU (default: the measured one)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--response", type=int, default=150, help="tokens per assistant turn (ours)")
    p.add_argument("--observation", type=int, default=200, help="tokens of each observation message (ours)")
    args = p.parse_args(argv)

    measured = json.loads(args.measured.read_text()) if args.measured else {}
    ratio = args.ratio if args.ratio is not None else measured.get("median_ratio_seeupo_over_grpo")
    mfu = args.mfu if args.mfu is not None else measured.get("mfu")
    gen_rate = args.gen_tokens_per_s if args.gen_tokens_per_s is not None else measured.get("generate_tokens_per_s")
    if ratio is None or mfu is None or gen_rate is None:
        raise SystemExit("give --measured (a GPU result of gpu_train.py) or all of --ratio, --mfu, --gen-tokens-per-s")
    prompts = json.loads((ROOT / "paper_repro" / "bfcl" / "prompt_lengths.json").read_text())["json/train"]
    context0 = int(statistics.median(prompts))
    tokens = step_tokens(context0, args.response, args.observation, args.turns, 32 * 8)
    flops = train_flops(QWEN3_14B, tokens)
    update = flops / (mfu * PEAK_BF16_H100 * args.gpus)
    score = 2 * update / 3
    gen = tokens["generated"] / (gen_rate * args.gpus)
    grpo, seeupo = gen + score + update, gen + score + ratio * update
    result = {
        "setting": {"model": "Qwen3-14B", "trajectories": 256, "turns": args.turns, "gpus": args.gpus,
                    "first_context_tokens (measured BFCL median)": context0, "response_tokens (ours)": args.response,
                    "observation_tokens (ours)": args.observation},
        "inputs": {"update_ratio": ratio, "mfu": mfu, "gen_tokens_per_s_per_gpu": gen_rate,
                   "source": str(args.measured) if args.measured else "assumed (flags)",
                   "device": measured.get("device")},
        "tokens": tokens, "train_flops": flops,
        "seconds": {"gen": gen, "score": score, "update_grpo": update, "update_seeupo": ratio * update,
                    "step_grpo": grpo, "step_seeupo": seeupo},
        "ratio_seeupo_over_grpo": seeupo / grpo,
        "ratio_without_generation": (score + ratio * update) / (score + update),
        "paper_ratio": [1.2, 1.9],
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
