"""Each saved counterexample drawn: the policy before and after the update, ``Q``, and where ``J`` fell.

Data: every file in ``paper_repro/counterexamples/`` (read and replayed from scratch: the update is
recomputed, nothing is taken on trust). For each history reached, the bars are the policy before
(light) and after (dark) the recorded update, the black ticks the exact ``Q`` of the policy before
(right axis); the title gives ``J`` before -> after and ``J*``. For a multi-turn example the
legend also gives ``J`` when only one turn's policy is replaced by its updated version (where the
decrease comes from).
"""

from __future__ import annotations

from typing import Any

from seeupo.figures._common import module_main, paper_repro, pyplot, rel, save


def _example(path) -> dict[str, Any]:
    import torch

    from seeupo.experiments.counterexamples import Counterexample
    from seeupo.tabular.exact import evaluate, mixed_policy
    from seeupo.tabular.train import track, AlgorithmStep

    torch.set_num_threads(1)
    ex = Counterexample.load(path)
    policy = ex.policy()
    with torch.no_grad():
        before = policy.action_probs()
    ev = evaluate(ex.problem, before)
    hist = track(ex.problem, AlgorithmStep(ex.algorithm, ex.run), policy, ex.iterations)
    with torch.no_grad():
        after = policy.action_probs()
    reach = ev.reach
    histories = []
    for t in range(ex.problem.num_turns):
        for h in range(before[t].shape[1]):
            histories.append({"turn": t, "history": h, "reach": float(reach[t][0, h]),
                              "pi_before": before[t][0, h].tolist(), "pi_after": after[t][0, h].tolist(),
                              "Q_before": ev.Q[t][0, h].tolist()})
    only = {}
    if ex.problem.num_turns > 1:
        for t in range(ex.problem.num_turns):
            only[str(t)] = float(evaluate(ex.problem, mixed_policy(before, after, [t])).J[0])
    return {"file": rel(path), "claim": ex.claim, "description": ex.description, "algorithm": ex.algorithm.name,
            "parameterization": ex.run.parameterization, "iterations": ex.iterations,
            "J_recorded": ex.J, "J": hist.J[:, 0].tolist(), "J_star": ex.J_star, "histories": histories,
            "J_only_turn_updated": only}


def compute(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    directory = paper_repro("counterexamples")
    files = sorted(directory.glob("*.json"))
    data: dict[str, Any] = {"source": rel(directory), "examples": [_example(f) for f in files]}
    if not files:
        data["note"] = f"no counterexample files in {rel(directory)}"
    return data


def plot(data: dict[str, Any], path) -> None:
    plt = pyplot()
    examples = data["examples"]
    fig, axes = plt.subplots(len(examples) or 1, 1, figsize=(8, 2.3 * max(1, len(examples))), squeeze=False)
    if not examples:
        axes[0][0].text(0.5, 0.5, data.get("note", "no counterexamples"), ha="center", va="center")
        axes[0][0].axis("off")
    for ax, ex in zip(axes[:, 0], examples):
        x, labels, q_x, q_y = 0, [], [], []
        for hrow in ex["histories"]:
            for a, (pb, pa, q) in enumerate(zip(hrow["pi_before"], hrow["pi_after"], hrow["Q_before"])):
                ax.bar(x - 0.18, pb, 0.36, color="#90caf9", label="pi before" if x == 0 else None)
                ax.bar(x + 0.18, pa, 0.36, color="#0d47a1", label="pi after" if x == 0 else None)
                q_x.append(x)
                q_y.append(q)
                labels.append(f"t{hrow['turn']} h{hrow['history']}\na{a}")
                x += 1
            x += 0.5
        ax.set_xticks(q_x, labels, fontsize=6)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("probability")
        ax2 = ax.twinx()
        ax2.plot(q_x, q_y, "_", color="black", ms=14, mew=2, label="Q (before)")
        ax2.set_ylabel("Q")
        J = ex["J"]
        extra = ""
        if ex["J_only_turn_updated"]:
            extra = "; J if only turn t updated: " + ", ".join(f"t{t}: {v:.4f}" for t, v in ex["J_only_turn_updated"].items())
        ax.set_title(f"{ex['file'].split('/')[-1]} ({ex['claim']}, {ex['algorithm']}, {ex['parameterization']} params): "
                     f"J {J[0]:.4f} -> {J[-1]:.4f} (fell {J[0] - J[-1]:.2e}), J* = {ex['J_star']:.4f}{extra}", fontsize=7)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=6)
    fig.suptitle("Saved counterexamples, replayed: one update lowers the exact J")
    fig.tight_layout()
    save(fig, path)


if __name__ == "__main__":
    raise SystemExit(module_main("counterexamples"))
