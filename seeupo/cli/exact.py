"""``seeupo exact``: exact ``J`` and ``J*`` (and optionally the per-history tables) of an instance file."""

from __future__ import annotations

import argparse

from seeupo.validation.arguments import positive_int
from seeupo.validation.files import dumps


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("exact", help="exact J and J* of an instance file",
                       description="Print J* (backward induction) and J of a policy (uniform by default) as one JSON object.")
    p.add_argument("instance", help="instance JSON file (format: seeupo.tabular.instances)")
    p.add_argument("--policy", help='policy JSON file {"action_probs": [...]} (default: uniform)')
    p.add_argument("--tables", action="store_true",
                   help="also print the per-history tables: optimal actions, V* and V of the initial states")
    p.add_argument("--max-cells", type=positive_int, default=10**7,
                   help="refuse instances with more table entries than this (default 10**7; larger files are allowed in proportion)")


def run(args: argparse.Namespace) -> int:
    from seeupo.tabular.exact import evaluate, optimal
    from seeupo.tabular.instances import load_policy, load_problem
    from seeupo.tabular.policies import uniform_probs

    problem = load_problem(args.instance, max_cells=args.max_cells)
    probs = load_policy(args.policy, problem, max_cells=args.max_cells) if args.policy else uniform_probs(problem)
    ev, opt = evaluate(problem, probs), optimal(problem)
    out = {
        "J_star": float(opt.J[0]),
        "J": float(ev.J[0]),
        "gap": float(opt.J[0] - ev.J[0]),
        "policy": args.policy or "uniform",
        "histories_per_turn": [problem.num_histories(t) for t in range(problem.num_turns)],
    }
    if args.tables:
        out |= {
            "optimal_actions": [p[0].argmax(-1).tolist() for p in opt.policy],
            "V_star_initial": opt.V[0][0].tolist(),
            "V_initial": ev.V[0][0].tolist(),
        }
    print(dumps(out))
    return 0
