"""The field's algorithms that the scorecard places a new one among, and what their papers claim.

Each entry is a registered algorithm: built in (a preset) or a plugin under ``examples/algorithms/``
whose docstring cites its paper and says what was simplified; its definition table, setting by
setting against its source, is :mod:`seeupo.experiments.scorecard.provenance`. A :class:`Claim` is a
published statement in its source's words, with the model it is made in; it is read only against
capabilities whose problems lie inside that model (:func:`claim_verdict`: agrees, disagrees with the
instance, outside the claim's model, or not testable with the mechanism that is missing). The SeeUPO
paper's Table 1 rows that say "no guarantee" (GRPO, REINFORCE++) claim nothing a score could
contradict and are not listed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


#: A claim's verdicts, in the order a reader needs them.
VERDICTS = {
    "agrees": "every case of its capabilities, all inside the claim's model, met the rule",
    "disagrees": "a case inside the claim's model failed the rule: the card names it",
    "outside the claim's model": "the claim is about a model (turns, outcomes, parameters) no capability measures "
                                 "alone: no verdict either way",
    "not testable": "no capability measures the mechanism the claim is about (it says which is missing)",
    "no evidence": "a capability the claim needs has no score on this card",
}


@dataclass(frozen=True)
class Claim:
    """A published claim, in its source's words, and the capabilities that test it inside its model.

    source: where it is said, precisely (paper and section or table; the authors' code);
    text: the claim, quoted where short, else closely paraphrased;
    model: the claim's model (turns, deterministic or stochastic outcomes, independent or shared parameters);
    capabilities: those whose every problem lies inside that model (the claim holds when each scores 1);
    untestable: the mechanism no capability measures yet, where that is why it cannot be tested (``None``: it can).
    """

    source: str
    text: str
    model: str
    capabilities: tuple[str, ...] = ()
    untestable: str | None = None


@dataclass(frozen=True)
class Entry:
    """One algorithm of the catalogue: its registered name, the plugin that registers it (``None``:
    built in), its paper, the claims its card is read against, and the published settings its card
    runs on top of the preset (``published``: the KL term its authors use; the presets stay KL-free,
    as the SeeUPO paper's Table 1 compares them, and ``seeupo verify`` and ``seeupo check`` run them so).
    """

    name: str
    title: str
    paper: str
    plugin: str | None = None
    claims: tuple[Claim, ...] = ()
    published: tuple[tuple[str, object], ...] = ()


_TABLE1 = "SeeUPO paper, Table 1 (docs/method.md §3)"


def _kl(estimator: str, placement: str, coef: float) -> tuple[tuple[str, object], ...]:
    """The published KL term as settings (each source: :mod:`seeupo.experiments.scorecard.provenance`'s KL row)."""
    return (("kl_estimator", estimator), ("kl_placement", placement), ("kl_coef", coef))
_DETERMINISTIC_MT = "several turns, deterministic outcomes, independent parameters per turn"

CATALOGUE: tuple[Entry, ...] = (
    Entry("ppo", "PPO with an exact critic (GAE)", "Schulman et al. 2017, arXiv:1707.06347; GAE: Schulman et al. 2016",
          claims=(Claim(_TABLE1, "GAE + PPU (token), e.g. PPO: \"converges\" in single-turn and in multi-turn",
                        "one turn and " + _DETERMINISTIC_MT + "; a critic's advantage (here exact)",
                        ("single_turn_monotone", "multi_turn_monotone", "multi_turn_convergence")),)),
    Entry("grpo", "GRPO", "Shao et al. 2024, arXiv:2402.03300", published=_kl("k3", "loss", 0.04)),
    Entry("dr_grpo", "Dr. GRPO", "Liu et al. 2025, arXiv:2503.20783", "examples/algorithms/dr_grpo.py",
          (Claim("its paper, §3.2", "GRPO's std normaliser gives a question-level difficulty bias; Dr. GRPO removes it",
                 "one turn; several questions in a batch whose rewards spread differently", ("difficulty_weighting",)),
           Claim("its paper, §3.2", "GRPO's 1/|o_i| gives a response-level length bias; Dr. GRPO removes it",
                 "one turn; one question, responses of different lengths", ("length_weighting",)))),
    Entry("dapo", "DAPO", "Yu et al. 2025, arXiv:2503.14476", "examples/algorithms/dapo.py",
          (Claim("its paper, §3.2 (dynamic sampling)", "filtering out the groups whose accuracy is all 0 or all 1 "
                 "keeps every update's gradient informative", "groups of one prompt whose rewards may all be equal",
                 ("zero_variance_groups",)),)),
    Entry("gspo", "GSPO", "Zheng et al. 2025, arXiv:2507.18071",
          claims=(Claim(_TABLE1, "GRAE + PPU (sequence), e.g. GSPO: \"converges\" in single-turn",
                        "one turn, deterministic outcomes", ("single_turn_monotone",)),)),
    Entry("rloo", "RLOO", "Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019", published=_kl("k1", "reward", 0.05),
          claims=(Claim(_TABLE1, "GRAE + REINFORCE (sequence), e.g. RLOO: \"converges\" in single-turn",
                        "one turn, deterministic outcomes", ("single_turn_monotone",)),
                  Claim("its paper, §3", "the leave-one-out baseline keeps the REINFORCE estimate unbiased",
                        "a whole completion as one action; a trajectory of turns is one such action",
                        ("agentic_credit",)))),
    Entry("reinforce_pp", "REINFORCE++", "Hu 2025, arXiv:2501.03262", published=_kl("k1", "reward", 0.01)),
    Entry("reinforce_pp_baseline", "REINFORCE++-baseline", "Hu 2025, arXiv:2501.03262",
          published=_kl("k2", "loss", 1e-5)),
    Entry("mt_grpo", "MT-GRPO", "Zeng et al. 2025, arXiv:2505.11821", "examples/algorithms/mt_grpo.py",
          (Claim("its paper, §4", "turn-level advantages give each turn its own credit (fine-grained credit "
                 "assignment)", "several turns with turn-level rewards (a tool call, then the answer)",
                 ("agentic_credit",)),)),
    Entry("gigpo", "GiGPO", "Feng et al. 2025, arXiv:2505.10978", "examples/algorithms/gigpo.py",
          published=_kl("k3", "loss", 0.01),
          claims=(Claim("its paper, §3", "step-level advantages over identical anchor states give each step its own "
                        "credit", "several turns where states recur within a group", ("agentic_credit",)),)),
    Entry("turn_ppo", "Turn-PPO (turn-level GAE)", "Li et al. 2025, arXiv:2512.17008", "examples/algorithms/turn_ppo.py"),
    Entry("seeupo", "SeeUPO", "arXiv:2602.06554", published=_kl("k3", "loss", 0.002),
          claims=(Claim("its paper, Theorem 1", "the sequential update inherits HAML's monotonic improvement",
                        _DETERMINISTIC_MT + " (each turn an agent); exact advantages", ("multi_turn_monotone",)),
                  Claim("its paper, Theorem 2", "with the reverse order it reaches the global optimum by backward "
                        "induction", "finite T, bounded rewards, exact advantages, a positive sampling distribution; "
                        "the theorem's argmax mirror step is run as the algorithm's own clipped update",
                        ("multi_turn_convergence",)))),
)
NAMES = tuple(e.name for e in CATALOGUE)


def entry(name: str) -> Entry | None:
    """The catalogue's entry for ``name``, or ``None`` for an algorithm outside it."""
    return next((e for e in CATALOGUE if e.name == name), None)


def claim_verdict(claim: Claim, scores: dict[str, float | None], worst: dict[str, str | None]) -> tuple[str, str]:
    """``(verdict, words)``: whether a card's ``scores`` bear out ``claim`` (a key of :data:`VERDICTS`).

    The claim needs a score of 1 on each of its capabilities, all of whose problems lie inside its
    model. A capability below 1 disagrees, named with its worst case; one without a score is no
    evidence either way; a claim with no capability inside its model is outside it or not testable.
    """
    if claim.untestable is not None:
        return "not testable", claim.untestable
    if not claim.capabilities:
        return "outside the claim's model", "no capability's problems all lie inside: " + claim.model
    below = [c for c in claim.capabilities if (scores.get(c) if scores.get(c) is not None else 1.0) < 1 - 1e-9]
    if below:
        return "disagrees", "; ".join(f"{c} {math.floor(scores[c] * 100 + 1e-9) / 100:.2f}: "  # rounded down: < 1
                                      f"{worst.get(c) or 'see the card'}" for c in below)
    missing = [c for c in claim.capabilities if scores.get(c) is None]
    if missing:
        return "no evidence", "not measured: " + ", ".join(missing)
    return "agrees", "every case of " + ", ".join(claim.capabilities) + " met the rule"
