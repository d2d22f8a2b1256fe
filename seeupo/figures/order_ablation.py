"""The update-order ablation: sweeps to reach ``J*`` as the number of turns grows (reverse / forward / random).

Exact mode, independent parameters, SeeUPO with each order, on random sequential bandits (3 actions
per turn, rewards on 5 levels, one initial state), from the uniform policy:

* left: the idealised update of Theorem 2, the exact argmax mirror step (``RunConfig(update="mirror",
  mirror_beta=0)``): reverse order is backward induction and needs one sweep for every ``T``;
  forward order needs up to ``T``. Crosses: instances built to need the most forward sweeps
  (``seeupo.theory.backward_induction``: ``[[0.6, 0.6], [1, 0]]`` needs 2, a 3-turn one needs 3);
* right: the practical update, the clipped sequence-level surrogate maximised by gradient steps
  (2 actions per turn): iterations until every instance is within 1e-3 of ``J*``.

Points are the mean over instances, bars the range (min to max).
"""

from __future__ import annotations

from typing import Any

from seeupo.figures._common import module_main, pyplot, save

ORDERS = ("reverse", "forward", "random")
WORST_FORWARD = {2: [[0.6, 0.6], [1.0, 0.0]], 3: [[[6, 2], [4, 1]], [[3, 5], [7, 0]]]}
MIRROR_TOL, GRADIENT_TOL = 1e-6, 1e-3


def _sweeps(gap_rows: list[list[float]], tol: float) -> list[int | None]:
    """Per instance, the first iteration with a gap below ``tol`` (``None``: not within the run)."""
    out = []
    for i in range(len(gap_rows[0])):
        out.append(next((k for k, row in enumerate(gap_rows) if row[i] < tol), None))
    return out


def _run_orders(problem, turns: int, iterations: int, seed: int, **settings) -> dict[str, list[int | None]]:
    import torch

    from seeupo.core.config import preset
    from seeupo.tabular.train import RunConfig, run

    torch.set_num_threads(1)
    mirror = settings.pop("mirror")
    out = {}
    for order in ORDERS:
        cfg = preset("seeupo", order=order, **settings)
        run_cfg = RunConfig(update="mirror", mirror_beta=0.0, iterations=iterations, seed=seed) if mirror else \
            RunConfig(mode="exact", iterations=iterations, lr=0.05, seed=seed)
        hist = run(problem, cfg, run_cfg)
        out[order] = _sweeps(hist.gap.tolist(), MIRROR_TOL if mirror else GRADIENT_TOL)
    return out


def compute(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    import torch

    from seeupo.tabular.problems import DTYPE, random_sequential_bandit, sequential_bandit

    max_turns_mirror, max_turns_grad = (4, 3) if quick else (5, 4)
    n_mirror, n_grad = (10, 4) if quick else (20, 8)
    grad_iterations, epochs = (12, 25) if quick else (20, 40)
    mirror, gradient, worst = {}, {}, {}
    for T in range(1, max_turns_mirror + 1):
        gen = torch.Generator().manual_seed(seed * 1000 + T)
        problem = random_sequential_bandit(n_mirror, (3,) * T, reward_levels=5, generator=gen)
        mirror[T] = _run_orders(problem, T, T + 1, seed, mirror=True)
    for T, rewards in WORST_FORWARD.items():
        r = torch.tensor(rewards, dtype=DTYPE)[None, None]
        problem = sequential_bandit(torch.tensor([1.0], dtype=DTYPE), tuple(r.shape[2:]), r[0])
        worst[T] = {o: v[0] for o, v in _run_orders(problem, T, T + 1, seed, mirror=True).items()}
    for T in range(1, max_turns_grad + 1):
        gen = torch.Generator().manual_seed(seed * 1000 + 100 + T)
        problem = random_sequential_bandit(n_grad, (2,) * T, reward_levels=5, generator=gen)
        gradient[T] = _run_orders(problem, T, grad_iterations, seed, mirror=False, epochs=epochs)
    return {"settings": {"mirror": {"actions": 3, "reward_levels": 5, "instances": n_mirror, "tol": MIRROR_TOL},
                         "gradient": {"actions": 2, "reward_levels": 5, "instances": n_grad, "iterations": grad_iterations,
                                      "epochs": epochs, "lr": 0.05, "clip": 0.2, "tol": GRADIENT_TOL}, "seed": seed},
            "mirror": {str(k): v for k, v in mirror.items()}, "worst_forward": {str(k): v for k, v in worst.items()},
            "gradient": {str(k): v for k, v in gradient.items()}}


def plot(data: dict[str, Any], path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.3))
    colors = {"reverse": "#d62728", "forward": "#1f77b4", "random": "#7f7f7f"}
    offsets = {"reverse": -0.12, "forward": 0.0, "random": 0.12}
    for ax, key in zip(axes, ("mirror", "gradient")):
        cap = data["settings"]["gradient"]["iterations"] if key == "gradient" else None
        for order in ORDERS:
            xs, means, lo, hi, missing = [], [], [], [], 0
            for T, per in sorted(data[key].items(), key=lambda kv: int(kv[0])):
                vals = [v for v in per[order] if v is not None]
                missing += len(per[order]) - len(vals)
                if not vals:
                    continue
                xs.append(int(T) + offsets[order])
                means.append(sum(vals) / len(vals))
                lo.append(means[-1] - min(vals))
                hi.append(max(vals) - means[-1])
            label = order + (f" ({missing} runs never within tol)" if missing else "")
            ax.errorbar(xs, means, yerr=[lo, hi], fmt="o-", color=colors[order], capsize=3, ms=4, label=label)
        if key == "mirror":
            for T, per in data["worst_forward"].items():
                for order in ORDERS:
                    if per[order] is not None:
                        ax.plot(int(T) + offsets[order], per[order], "x", color=colors[order], ms=8, mew=2)
            ax.plot([], [], "kx", label="built worst case for forward")
            ax.set_title("exact argmax mirror sweeps (Theorem 2's update)")
            ax.set_ylabel("sweeps until J = J*")
        else:
            ax.set_title(f"clipped surrogate, {data['settings']['gradient']['epochs']} gradient epochs per turn")
            ax.set_ylabel(f"iterations until gap < {data['settings']['gradient']['tol']:g} (cap {cap})")
        ax.set_xlabel("turns T")
        ax.set_xticks(sorted(int(t) for t in data[key]))
        ax.legend(loc="upper left")
    fig.suptitle("Update order of SeeUPO: reverse order is backward induction (exact mode, random sequential bandits)")
    fig.tight_layout()
    save(fig, path)


if __name__ == "__main__":
    raise SystemExit(module_main("order_ablation"))
