"""Entropy and pass@k along each algorithm's own exact updates, on problems with several right answers.

``python -m seeupo.experiments.diversity --out DIR`` runs every catalogue algorithm (its exact-mode protocol and
published KL term, :func:`seeupo.experiments.scorecard.card.context`) and the entropy controls of :data:`CONTROLS`
(clip-higher, an entropy bonus, Clip-Cov, KL-Cov) on seeded
single-turn token bandits whose answers are right (reward 1) or wrong (0), three of eight right, and records after
every update: ``J``, the entropy of the answer distribution, pass@k for k = 1..64 and the share of the right
answers' mass held by all but the likeliest (:mod:`seeupo.tabular.diversity`). It writes ``diversity.md`` and
``diversity.json``: per algorithm, at the first update where ``J >= 0.99 J*`` and at the last, the entropy, the
alternative mass and pass@1 against pass@64 (mean over the instances), and the covariance identity's first-order
prediction of the first update's entropy change against the exact change (Cui et al. 2025, Lemma 1:
``dH ~ -Cov(log pi, the logits' change)``).

Every number is exact and a function of the seed: the updates are the expected ones, nothing is sampled.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import torch

from seeupo.core.losses import entropy_of_log_probs
from seeupo.tabular.diversity import alternative_mass, entropy_change_prediction, entropy_per_turn, pass_at_k
from seeupo.tabular.exact import evaluate, optimal
from seeupo.tabular.policies import TabularPolicy
from seeupo.tabular.problems import DTYPE, TreeMDP, sequential_bandit

KS = (1, 2, 4, 8, 16, 32, 64)
#: Right answers among the eight answers (3 binary tokens) of each problem.
RIGHT = 3


def right_answers_bandit(instances: int, seed: int, prompts: int = 1) -> TreeMDP:
    """1-turn bandits of 3 binary tokens (8 answers) and ``prompts`` equally likely prompts (initial states), ``RIGHT``
    answers of each prompt (drawn) paying 1, the others 0."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.zeros(instances, prompts, 8, dtype=DTYPE)
    for i in range(instances):
        for s in range(prompts):
            rewards[i, s, torch.randperm(8, generator=gen)[:RIGHT]] = 1.0
    rho = torch.full((instances, prompts), 1.0 / prompts, dtype=DTYPE)
    return sequential_bandit(rho, (8,), rewards, tokens=((2, 3),))


#: The settings measured: (words, prompts, parameterization). With one parameter table for every prompt (a small
#: model of a language model's sharing) a prompt can lose its right answers to what the others learn.
SETTINGS = (("one prompt, independent parameters", 1, "independent"),
            ("4 prompts sharing parameters (4 features)", 4, "shared"))


def _measure(problem: TreeMDP, policy: TabularPolicy) -> dict[str, list[float]]:
    with torch.no_grad():
        probs = policy.action_probs()
        return {"J": evaluate(problem, probs).J.tolist(), "entropy": entropy_per_turn(problem, probs)[0].tolist(),
                "pass": pass_at_k(problem, probs, KS).T.tolist(), "alternative": alternative_mass(problem, probs).tolist()}


def _first_token(policy: TabularPolicy) -> torch.Tensor:
    """``[I, S0, V]``: the log-probabilities of the answer's first token at each prompt."""
    return policy.token_log_probs()[0][0].detach()[:, :, 0]


def _identity(before: torch.Tensor, after: torch.Tensor) -> tuple[float, float]:
    """The first token's entropy change over one update (summed over prompts, mean over instances): the
    first-order prediction from the logits' change and the exact change."""
    delta = after - before  # log-softmax differences: the logits' change up to a constant, which Cov ignores
    predicted = entropy_change_prediction(before, delta)
    change = entropy_of_log_probs(after) - entropy_of_log_probs(before)
    return float(predicted.sum(-1).mean()), float(change.sum(-1).mean())


#: The plugins that register the controls' algorithms (relative to the repository).
CONTROL_PLUGINS = ("examples/algorithms/clip_cov.py", "examples/algorithms/kl_cov.py")
#: The entropy controls compared beside the catalogue: (label, registered algorithm, settings changed), each on top of
#: that algorithm's card (its protocol and published KL term); ``clip_cov`` and ``kl_cov`` are plugins.
CONTROLS = (("grpo, clip-higher 0.28", "grpo", {"clip_eps_high": 0.28}),
            ("grpo, entropy bonus 0.001", "grpo", {"entropy_coef": 0.001}),
            ("clip_cov", "clip_cov", {}), ("kl_cov", "kl_cov", {}),
            # Clip-Cov's clip without its covariance rule, and GRPO unclipped, both without a KL term as the two
            # plugins' presets: what the covariance rules add
            ("grpo, no KL, clip 1 / 1 (clip_cov's, no covariance rule)", "grpo",
             {"kl_coef": 0.0, "clip_eps_low": 1 - 1e-6, "clip_eps_high": 1.0}),
            ("grpo, no KL, unclipped (kl_cov's surrogate, no covariance rule)", "grpo",
             {"kl_coef": 0.0, "clip_eps_low": 1 - 1e-6, "clip_eps_high": 1e6}))


def run_algorithm(name: str, problem: TreeMDP, updates: int, plugins: tuple[str, ...] = (),
                  parameterization: str = "independent", changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """``name``'s own exact updates on ``problem`` from the uniform policy (``changes``: settings replaced), measured
    after each (module docstring)."""
    from seeupo.experiments.scorecard.base import Sizes
    from seeupo.experiments.scorecard.card import context
    from seeupo.tabular.train import AlgorithmStep, RunConfig

    ctx = context(name, Sizes(), None, plugins)
    config = ctx.config.replace(group_size=4, **(changes or {}))
    step = AlgorithmStep(config, RunConfig(mode="exact", optimizer=ctx.optimizer, lr=ctx.lr))  # type: ignore[arg-type]
    policy = TabularPolicy(problem, parameterization)  # type: ignore[arg-type]
    history = [_measure(problem, policy)]
    identity = []
    for k in range(updates * ctx.iterations_factor):
        before = _first_token(policy)
        step(problem, policy)
        identity.append(_identity(before, _first_token(policy)))
        if (k + 1) % ctx.iterations_factor == 0:
            history.append(_measure(problem, policy))
    return {"algorithm": name, "config": config.to_dict(), "optimizer": ctx.optimizer, "lr": ctx.lr,
            "history": history, "identity": identity}


def summary(run: dict[str, Any], j_star: list[float]) -> dict[str, Any]:
    """Per instance, the first update with ``J >= 0.99 J*`` and the quantities there and at the end (means)."""
    history = run["history"]
    instances = len(j_star)
    reached, at_reach = [], []
    for i in range(instances):
        k = next((k for k, h in enumerate(history) if h["J"][i] >= 0.99 * j_star[i]), None)
        reached.append(k)
        if k is not None:
            h = history[k]
            at_reach.append((h["entropy"][i], h["alternative"][i], h["pass"][i][0], h["pass"][i][-1]))
    last = history[-1]
    mean = lambda xs: sum(xs) / len(xs) if xs else math.nan  # noqa: E731
    moved = [(p, e) for p, e in run["identity"] if abs(e) > 1e-6]  # updates that changed the entropy
    return {
        "reached": sum(k is not None for k in reached), "instances": instances,
        "updates_to_reach": mean([k for k in reached if k is not None]),
        "at_reach": {"entropy": mean([a[0] for a in at_reach]), "alternative": mean([a[1] for a in at_reach]),
                     "pass@1": mean([a[2] for a in at_reach]), "pass@64": mean([a[3] for a in at_reach])},
        "last": {"J_gap": mean([j_star[i] - last["J"][i] for i in range(instances)]),
                 "entropy": mean(last["entropy"]), "alternative": mean(last["alternative"]),
                 "pass@1": mean([p[0] for p in last["pass"]]), "pass@64": mean([p[-1] for p in last["pass"]])},
        "identity": {"updates": len(moved), "same_sign": sum((p > 0) == (e > 0) for p, e in moved),
                     "predicted": sum(p for p, _ in moved), "exact": sum(e for _, e in moved)},
    }


def curves(run: dict[str, Any]) -> dict[str, list[float]]:
    """After each update, the means over the instances of ``J``, the entropy, the alternative mass and pass@k for
    each ``k`` of :data:`KS` (``pass@k``): what a plot of the run needs, without the per-instance detail."""
    mean = lambda xs: round(sum(xs) / len(xs), 6)  # noqa: E731
    out: dict[str, list[float]] = {key: [mean(h[key]) for h in run["history"]] for key in ("J", "entropy", "alternative")}
    for j, k in enumerate(KS):
        out[f"pass@{k}"] = [mean([p[j] for p in h["pass"]]) for h in run["history"]]
    return out


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = ["# Entropy and pass@k along exact updates", "",
             f"Seed {s['seed']}, {s['instances']} single-turn bandits of 3 binary tokens (8 answers) per setting, "
             f"{RIGHT} right (reward 1) and 5 wrong per prompt; each algorithm's own exact updates ({s['updates']}, its `seeupo verify` protocol "
             "and its published KL term) from the uniform policy (entropy log 8 = 2.079, pass@1 0.375, pass@64 1). "
             "\"At 0.99 J*\": the first update where J reaches 0.99 J* (means over the instances that reach it); "
             "\"alternative mass\": the right answers' probability held by all but the likeliest, as a share of "
             "theirs (0: one right answer kept). The identity: each update's change of the first token's entropy "
             "predicted to first order from its logits' change, `-Cov(log pi, delta)` (Cui et al. 2025, Lemma 1), "
             "against the exact change, over the updates that changed it by more than 1e-6: how many have the "
             "predicted sign, and the summed predicted and exact changes."]
    f = lambda x: "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"  # noqa: E731
    for words, rows in report["settings_measured"].items():
        lines += ["", f"## {words}", "",
                  "| Algorithm | reached 0.99 J* | updates | entropy | alternative mass | pass@1 | pass@64 | last: gap "
                  "to J* | entropy | alternative mass | pass@1 | pass@64 | identity: sign right / updates; dH "
                  "predicted, exact |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, row in rows.items():
            a, z, ident = row["at_reach"], row["last"], row["identity"]
            lines.append(f"| {name} | {row['reached']} of {row['instances']} | {f(row['updates_to_reach'])} | "
                         f"{f(a['entropy'])} | {f(a['alternative'])} | {f(a['pass@1'])} | {f(a['pass@64'])} | "
                         f"{z['J_gap']:.2g} | {f(z['entropy'])} | {f(z['alternative'])} | {f(z['pass@1'])} | "
                         f"{f(z['pass@64'])} | {ident['same_sign']} / {ident['updates']}; {ident['predicted']:+.3f}, "
                         f"{ident['exact']:+.3f} |")
    return "\n".join(lines) + f"\n\n{report['seconds']:.0f} s.\n"


def main(argv: list[str] | None = None) -> int:
    from seeupo.experiments.offpolicy import positive_int, report_folder
    from seeupo.experiments.scorecard.catalogue import CATALOGUE
    from seeupo.experiments.verdicts import resolve_dir
    from seeupo.plugins import load_plugins

    parser = argparse.ArgumentParser(prog="python -m seeupo.experiments.diversity", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--instances", type=positive_int, default=6)
    parser.add_argument("--updates", type=positive_int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier report in --out")
    args = parser.parse_args(argv)
    # the catalogue's and the controls' plugins, found from any working directory (the repository's examples)
    files = [resolve_dir(p) for p in (*(e.plugin for e in CATALOGUE if e.plugin), *CONTROL_PLUGINS)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        parser.error(f"the plugin files {', '.join(missing)} are not here: run it from a checkout of the repository")
    out = report_folder(parser, args.out, ("diversity.md", "diversity.json"), args.overwrite)
    plugins = tuple(str(f) for f in files)
    load_plugins(list(plugins), "--plugin")
    start = time.perf_counter()
    measured: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    for words, prompts, parameterization in SETTINGS:
        problem = right_answers_bandit(args.instances, args.seed, prompts)
        j_star = optimal(problem).J.tolist()
        measured[words], runs[words] = {}, {}
        chosen = [(e.name, e.name, {}) for e in CATALOGUE] + list(CONTROLS)
        for label, name, changes in chosen:
            runs[words][label] = run_algorithm(name, problem, args.updates, plugins, parameterization, changes)
            measured[words][label] = summary(runs[words][label], j_star)
            print(f"{words}, {label}: done ({time.perf_counter() - start:.0f} s)")
    report = {"settings": {"seed": args.seed, "instances": args.instances, "updates": args.updates, "ks": list(KS)},
              "settings_measured": measured, "curves": {words: {label: curves(run) for label, run in by_label.items()}
                                                        for words, by_label in runs.items()},
              "seconds": round(time.perf_counter() - start, 1)}
    (out / "diversity.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "diversity.md").write_text(markdown(report))
    print(f"wrote {out}/diversity.md ({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
