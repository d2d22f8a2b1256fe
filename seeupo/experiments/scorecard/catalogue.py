"""The field's algorithms that the scorecard places a new one among, and what their papers claim.

Each entry is a registered algorithm: built in (a preset) or a plugin under ``examples/algorithms/``
whose docstring cites its paper and says what was simplified. A :class:`Claim` is a published
statement about the algorithm that a capability measures; the field's table says where a card
disagrees with it, with the instance (:func:`claim_verdict`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """A published claim a card can contradict: it holds when each of ``capabilities`` scores 1.

    source: who claims it (the algorithm's own paper, or the SeeUPO paper's Table 1 about it);
    text: the claim, paraphrased, and its scope.
    """

    source: str
    text: str
    capabilities: tuple[str, ...]


@dataclass(frozen=True)
class Entry:
    """One algorithm of the catalogue: its registered name, the plugin that registers it (``None``:
    built in), its paper, and the claims its card is read against."""

    name: str
    title: str
    paper: str
    plugin: str | None = None
    claims: tuple[Claim, ...] = ()


_TABLE1 = "SeeUPO paper, Table 1 (docs/method.md §3)"

CATALOGUE: tuple[Entry, ...] = (
    Entry("ppo", "PPO with an exact critic (GAE)", "Schulman et al. 2017, arXiv:1707.06347; GAE: Schulman et al. 2016",
          claims=(Claim(_TABLE1, "converges in a single turn and over several (critic-based advantage, clipped update)",
                        ("single_turn_monotone", "multi_turn_monotone")),)),
    Entry("grpo", "GRPO", "Shao et al. 2024, arXiv:2402.03300"),
    Entry("dr_grpo", "Dr. GRPO", "Liu et al. 2025, arXiv:2503.20783", "examples/algorithms/dr_grpo.py",
          (Claim("its paper (§3.2)", "removing the std and length normalisers makes the policy gradient unbiased",
                 ("agentic_credit",)),)),
    Entry("dapo", "DAPO", "Yu et al. 2025, arXiv:2503.14476", "examples/algorithms/dapo.py",
          (Claim("its paper (dynamic sampling)", "filtering the groups whose rewards are all equal keeps every "
                 "update's gradient informative", ("zero_variance_groups",)),)),
    Entry("gspo", "GSPO", "Zheng et al. 2025, arXiv:2507.18071",
          claims=(Claim(_TABLE1, "converges in a single turn (sequence-level ratio)",
                        ("single_turn_monotone", "stochastic_outcomes")),)),
    Entry("rloo", "RLOO", "Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019",
          claims=(Claim("its paper", "the leave-one-out baseline leaves the policy gradient unbiased",
                        ("agentic_credit",)),)),
    Entry("reinforce_pp", "REINFORCE++", "Hu 2025, arXiv:2501.03262"),
    Entry("reinforce_pp_baseline", "REINFORCE++-baseline", "Hu 2025, arXiv:2501.03262"),
    Entry("mt_grpo", "MT-GRPO", "Zeng et al. 2025, arXiv:2505.11821", "examples/algorithms/mt_grpo.py",
          (Claim("its paper", "turn-level advantages give each turn its own credit", ("agentic_credit",)),)),
    Entry("gigpo", "GiGPO", "Feng et al. 2025, arXiv:2505.10978", "examples/algorithms/gigpo.py",
          (Claim("its paper", "step-level advantages over identical states give each step its own credit",
                 ("agentic_credit",)),)),
    Entry("turn_ppo", "Turn-PPO (turn-level GAE)", "Li et al. 2025, arXiv:2512.17008", "examples/algorithms/turn_ppo.py"),
    Entry("seeupo", "SeeUPO", "arXiv:2602.06554",
          claims=(Claim("its paper (Theorem 1)", "every update improves J monotonically, over several turns and with "
                        "stochastic outcomes (independent parameters per turn)",
                        ("single_turn_monotone", "multi_turn_monotone", "stochastic_outcomes")),
                  Claim("its paper (Theorem 2)", "converges to the global optimum J*", ("multi_turn_convergence",)))),
)
NAMES = tuple(e.name for e in CATALOGUE)


def entry(name: str) -> Entry | None:
    """The catalogue's entry for ``name``, or ``None`` for an algorithm outside it."""
    return next((e for e in CATALOGUE if e.name == name), None)


def claim_verdict(claim: Claim, scores: dict[str, float | None], worst: dict[str, str | None]) -> tuple[str, str]:
    """``("agrees" | "disagrees" | "no evidence", words)``: whether a card's ``scores`` bear out ``claim``.

    The claim needs a score of 1 on each of its capabilities. A capability below 1 disagrees,
    named with its worst case; one without a score is no evidence either way.
    """
    below = [c for c in claim.capabilities if (scores.get(c) if scores.get(c) is not None else 1.0) < 1 - 1e-9]
    if below:
        return "disagrees", "; ".join(f"{c} {scores[c]:.2f}: {worst.get(c) or 'see the card'}" for c in below)
    missing = [c for c in claim.capabilities if scores.get(c) is None]
    if missing:
        return "no evidence", "not measured: " + ", ".join(missing)
    return "agrees", "every case of " + ", ".join(claim.capabilities) + " met the rule"
