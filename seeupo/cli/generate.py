"""``seeupo generate``: a random instance file (sequential bandit or tree MDP), refused above a size limit."""

from __future__ import annotations

import argparse

from seeupo.cli.common import MAX_CELLS, UsageError
from seeupo.validation.arguments import int_range, path_arg, positive_int, probability, seed_int, writable_file
from seeupo.validation.files import dumps
from seeupo.validation.schemas import table_cells


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="write a random instance file", description="Write a random instance as JSON.")
    p.add_argument("--kind", choices=["sequential_bandit", "tree_mdp"], default="sequential_bandit")
    p.add_argument("--turns", type=positive_int, default=2)
    p.add_argument("--actions", type=positive_int, default=3, help="actions per turn (ignored with --length > 1)")
    p.add_argument("--vocab-size", type=positive_int, default=2, help="token vocabulary (with --length > 1)")
    p.add_argument("--length", type=positive_int, default=1, help="tokens per action (sequential bandit only)")
    p.add_argument("--observations", type=positive_int, default=2, help="observations per turn (tree MDP)")
    p.add_argument("--initial-states", type=positive_int, default=1)
    p.add_argument("--terminate-prob", type=probability, default=0.2, help="early termination probability in [0, 1] (tree MDP)")
    p.add_argument("--gamma", type=probability, default=1.0, help="discount in [0, 1] (tree MDP)")
    p.add_argument("--reward-levels", type=int_range(2, 10**6), default=None,
                   help="rewards on this many levels, 2 to 10**6 (default: uniform in [0, 1])")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--max-cells", type=positive_int, default=MAX_CELLS,
                   help=f"refuse instances with more table entries than this (default {MAX_CELLS}, about 20 MB of JSON)")
    p.add_argument("--out", type=path_arg, help="output file (default: stdout)")


def generated_cells(args: argparse.Namespace) -> int:
    """Table entries of the instance ``seeupo generate`` would write (computed without building it)."""
    if args.kind == "sequential_bandit":
        actions = args.vocab_size**args.length if args.length > 1 else args.actions
        return table_cells(args.initial_states, (actions,) * args.turns)
    return table_cells(args.initial_states, (args.actions,) * args.turns, (args.observations,) * args.turns)


def run(args: argparse.Namespace) -> int:
    if args.length > 1 and args.length * (args.vocab_size.bit_length()) > 64:
        raise UsageError(f"argument --length: {args.length} tokens from a vocabulary of {args.vocab_size} spell too many actions")
    if args.turns > 64:
        raise UsageError("argument --turns: at most 64")
    cells = generated_cells(args)
    if cells > args.max_cells:
        raise UsageError(f"the instance these sizes ask for (--turns, --actions, ...) would have {cells:.3g} table entries, "
                         f"more than --max-cells {args.max_cells}; choose smaller sizes or raise --max-cells")
    out = writable_file(args.out, "--out") if args.out else None

    import torch

    from seeupo.tabular.instances import problem_to_dict
    from seeupo.tabular.problems import random_sequential_bandit, random_tree_mdp

    gen = torch.Generator().manual_seed(args.seed)
    actions = tuple([args.actions] * args.turns)
    if args.kind == "sequential_bandit":
        tokens = (args.vocab_size, args.length) if args.length > 1 else None
        if tokens is not None:
            actions = tuple([args.vocab_size**args.length] * args.turns)
        problem = random_sequential_bandit(
            1, actions, num_initial_states=args.initial_states, reward_levels=args.reward_levels, tokens=tokens, generator=gen
        )
    else:
        problem = random_tree_mdp(
            1, actions, tuple([args.observations] * args.turns), num_initial_states=args.initial_states,
            terminate_prob=args.terminate_prob, gamma=args.gamma, reward_levels=args.reward_levels, generator=gen,
        )
    text = dumps(problem_to_dict(problem))
    if out is not None:
        out.write_text(text + "\n")
        print(f"Wrote {out}.")
    else:
        print(text)
    return 0
