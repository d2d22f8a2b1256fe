"""Benchmark: exact J of many tabular problems in one batched call vs a plain-Python loop.

Workload: 10,000 random sequential bandits (the paper's model), T = 4 turns, 4 actions per
turn, one initial state, a random stochastic policy. ``N_t = 4**t`` histories per turn,
256 complete paths per instance.

* batched: one :func:`seeupo.tabular.exact.evaluate` call over all 10,000 instances, timed with
  one intra-op thread and with torch's default thread count.
* loop: backward induction in plain Python (nested loops over turns, histories, actions and
  observations on Python floats, no torch), one instance at a time. It is timed on a subset
  of ``--subset`` instances only, and the per-instance time is extrapolated to the whole
  workload (said so in the output). The conversion of the tensors to Python lists is timed
  separately and not counted in the loop time.

Each measurement is repeated ``--repeats`` times and the minimum (the warm steady state) is
reported; the median and every single timing are recorded in the JSON file. On a shared machine the multi-threaded
batched call is fragile: on the 2-CPU development VM, while another process kept one core
busy, 2-thread calls took ~0.44 s against ~0.02-0.06 s with one thread and ~0.013 s with both cores
free (the worker threads wait for each other), so both thread counts are reported; the
plain-Python loop was stable to a few percent.

Both methods are run in the same process, and their J values are checked to agree on the
subset. Results are printed, written to ``benchmarks/results/exact_batched.json`` and a line
is appended to ``benchmarks/RESULTS.md``.

Usage::

    python benchmarks/exact_batched.py [--instances 10000] [--subset 200] [--repeats 30] [--no-record]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from seeupo.tabular.exact import evaluate
from seeupo.tabular.problems import DTYPE, TreeMDP, random_sequential_bandit

HERE = Path(__file__).resolve().parent
RESULTS_JSON = HERE / "results" / "exact_batched.json"
RESULTS_MD = HERE / "RESULTS.md"
MD_HEADER = """# Benchmark results

One line per benchmark run, newest last. Each line names the script, the machine and the numbers;
the full record of the latest run of each script is in `benchmarks/results/<script>.json`.

"""


def random_policy(problem: TreeMDP, generator: torch.Generator) -> list[torch.Tensor]:
    out = []
    for t, a in enumerate(problem.actions_per_turn):
        x = -torch.log(torch.rand((problem.num_instances, problem.num_histories(t), a), generator=generator, dtype=DTYPE))
        out.append(x / x.sum(-1, keepdim=True))
    return out


def to_python(problem: TreeMDP, probs: list[torch.Tensor], instances: range) -> list[dict]:
    """Per-instance nested Python lists of everything the plain-Python evaluation reads."""
    rho = problem.initial_state_probs.tolist()
    obs = [x.tolist() for x in problem.obs_probs]
    rew = [x.tolist() for x in problem.rewards]
    term = [x.tolist() for x in problem.terminal]
    pol = [p.tolist() for p in probs]
    return [
        {
            "rho": rho[i],
            "obs": [o[i] for o in obs],
            "rew": [r[i] for r in rew],
            "term": [e[i] for e in term],
            "pi": [p[i] for p in pol],
        }
        for i in instances
    ]


def python_J(inst: dict, actions: tuple[int, ...], obs_per_turn: tuple[int, ...], gamma: float) -> float:
    """Backward induction with plain Python loops over histories (no torch, no vectorisation)."""
    v_next: list[float] | None = None
    for t in reversed(range(len(actions))):
        A, O = actions[t], obs_per_turn[t]
        obs, rew, term, pi = inst["obs"][t], inst["rew"][t], inst["term"][t], inst["pi"][t]
        v = [0.0] * len(pi)
        for h in range(len(pi)):
            total = 0.0
            for a in range(A):
                q = 0.0
                for o in range(O):
                    cont = 0.0
                    if v_next is not None and not term[h][a][o]:
                        cont = gamma * v_next[(h * A + a) * O + o]
                    q += obs[h][a][o] * (rew[h][a][o] + cont)
                total += pi[h][a] * q
            v[h] = total
        v_next = v
    return sum(p * v0 for p, v0 in zip(inst["rho"], v_next))


def time_batched(problem: TreeMDP, probs: list[torch.Tensor], threads: int, repeats: int) -> tuple[dict, torch.Tensor]:
    """Timings of one ``evaluate()`` call over every instance with ``threads`` intra-op threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        evaluate(problem, probs)  # untimed warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            ev = evaluate(problem, probs)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    best = min(times)
    return {
        "threads": threads,
        "seconds": best,
        "seconds_median": statistics.median(times),
        "seconds_all_repeats": times,
        "per_instance_us": best / problem.num_instances * 1e6,
    }, ev.J


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--actions", type=int, default=4)
    parser.add_argument("--subset", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--no-record", action="store_true", help="print only; do not write the results files")
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(0)
    actions = (args.actions,) * args.turns
    problem = random_sequential_bandit(args.instances, actions, generator=gen)
    probs = random_policy(problem, gen)

    # batched: one evaluate() call over every instance, with 1 thread and with torch's default
    default_threads = torch.get_num_threads()
    batched, batched_J = [], None
    for threads in sorted({1, default_threads}):
        result, batched_J = time_batched(problem, probs, threads, args.repeats)
        batched.append(result)

    # plain-Python loop on a subset, extrapolated per instance
    subset = range(min(args.subset, args.instances))
    start = time.perf_counter()
    data = to_python(problem, probs, subset)
    convert_s = time.perf_counter() - start
    loop_times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        loop_J = [python_J(inst, problem.actions_per_turn, problem.obs_per_turn, problem.gamma) for inst in data]
        loop_times.append(time.perf_counter() - start)
    loop_subset_s = min(loop_times)
    loop_per_instance_s = loop_subset_s / len(subset)
    loop_extrapolated_s = loop_per_instance_s * args.instances

    max_abs_diff = max(abs(a - b) for a, b in zip(loop_J, batched_J[: len(subset)].tolist()))
    if max_abs_diff > 1e-12:
        raise SystemExit(f"batched and plain-Python J disagree on the subset: max |diff| = {max_abs_diff:.3e}")
    for result in batched:
        result["speedup_per_instance_vs_loop"] = loop_per_instance_s / (result["seconds"] / args.instances)

    record = {
        "benchmark": "exact_batched",
        "timestamp_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_default_threads": default_threads,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "load_average_1_5_15_min_at_end": list(os.getloadavg()),
        },
        "workload": {
            "problem": "random_sequential_bandit",
            "instances": args.instances,
            "turns": args.turns,
            "actions_per_turn": args.actions,
            "paths_per_instance": problem.num_histories(problem.num_turns),
            "policy": "random stochastic",
            "dtype": "float64",
        },
        "batched": batched,
        "python_loop": {
            "timed_instances": len(subset),
            "seconds_on_subset": loop_subset_s,
            "seconds_on_subset_median": statistics.median(loop_times),
            "seconds_on_subset_all_repeats": loop_times,
            "per_instance_us": loop_per_instance_s * 1e6,
            "extrapolated_seconds_all_instances": loop_extrapolated_s,
            "extrapolated": True,
            "list_conversion_seconds_on_subset_not_counted": convert_s,
        },
        "agreement_max_abs_diff_on_subset": max_abs_diff,
    }

    batched_text = "; ".join(
        f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}: {r['seconds'] * 1e3:.1f} ms "
        f"({r['per_instance_us']:.2f} us/instance, median {r['seconds_median'] * 1e3:.1f} ms, "
        f"speed-up x{r['speedup_per_instance_vs_loop']:.0f} per instance)"
        for r in batched
    )
    loop_median_us = record["python_loop"]["seconds_on_subset_median"] / len(subset) * 1e6
    line = (
        f"- {record['timestamp_utc']} `exact_batched.py`: exact J of {args.instances:,} sequential bandits "
        f"(T={args.turns}, {args.actions} actions/turn, {record['workload']['paths_per_instance']} paths each), float64, "
        f"{record['machine']['cpu_count']} CPUs (1-min load {os.getloadavg()[0]:.2f}), torch {torch.__version__}. "
        f"One batched evaluate() call, {batched_text}. "
        f"Plain-Python loop: {loop_per_instance_s * 1e6:.0f} us/instance (median {loop_median_us:.0f}), timed on "
        f"{len(subset)} instances and extrapolated to {loop_extrapolated_s:.2f} s for all {args.instances:,}. "
        f"Times are minima of {args.repeats} repeats. Agreement on the subset: max |dJ| = {max_abs_diff:.1e}."
    )
    print(json.dumps(record, indent=2))
    print(line)
    if not args.no_record:
        RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
        RESULTS_JSON.write_text(json.dumps(record, indent=2) + "\n")
        if not RESULTS_MD.exists():
            RESULTS_MD.write_text(MD_HEADER)
        with RESULTS_MD.open("a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
