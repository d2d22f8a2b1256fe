"""The ``M`` ablation: SeeUPO's sequential weight ``M`` as HAPPO's product, none, clipped or misaligned.

Measured here, on the problems of claims ``REF-M`` / ``REF-M-clip`` (3-turn random tree MDPs with
stochastic observations, early termination and rewards on 3 levels; ``seeupo.experiments.claims``'s
``mt3_tree``), independent parameters, exact and sampled mode:

* ``HAPPO``: ``M <- M * pi_new / pi_old`` per trajectory (SeeUPO, HARL);
* ``none``: every turn updated on the plain advantage (sequential, but no correction);
* ``clipped (ref. code)``: each factor and the running product clipped to [0.8, 1.2];
* ``misaligned (ref. code)``: ``M`` positional while each turn batch is re-ordered (``m_alignment="shuffled"``).
"""

from __future__ import annotations

from typing import Any

from seeupo.figures._common import module_main, plot_variants, variant_runs

VARIANTS = {"HAPPO (SeeUPO)": {"m_factor": "happo"}, "none": {"m_factor": "none"},
            "clipped (ref. code)": {"m_factor": "clipped"}, "misaligned (ref. code)": {"m_alignment": "shuffled"}}
COLORS = dict(zip(VARIANTS, ("#d62728", "#1f77b4", "#ff7f0e", "#7f7f7f")))


def compute(quick: bool = False, seed: int = 0) -> dict[str, Any]:
    from seeupo.experiments.claims import _problems

    instances, iterations = (4, 6) if quick else (16, 15)
    problem = _problems("mt3_tree", instances, seed=seed)
    modes = {"exact": {"epochs": 40, "iterations": iterations},
             "sampled": {"epochs": 2, "minibatches": 2, "iterations": iterations * 4}}
    return {"setting": {"problems": "mt3_tree (claims REF-M)", "turns": 3, "instances": instances, "seed": seed},
            "runs": variant_runs(problem, VARIANTS, modes, seed)}


def plot(data: dict[str, Any], path) -> None:
    plot_variants(data, path, "SeeUPO's factor M: HAPPO vs none vs the reference code's clipped and misaligned M "
                              f"(3-turn tree MDPs, {data['setting']['instances']} instances)", COLORS)


if __name__ == "__main__":
    raise SystemExit(module_main("m_ablation"))
