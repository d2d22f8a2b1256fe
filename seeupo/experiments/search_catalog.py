"""The paper's registered counterexample searches by name: what each is about, without its strategy.

One table, imported by :mod:`seeupo.experiments.searches` (which pairs each entry with its
hypothesis strategy to build ``SEARCHES``, in this order) and by ``seeupo search --help`` (which
lists it). It lives apart from the strategies because those import hypothesis and torch: the help
text would take seconds, and ``seeupo --help`` builds every command's parser.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogEntry:
    """A registered search's name, the claim it bears on (``seeupo.experiments.claims``), what it
    searches for, and its default budget of hypothesis examples."""

    name: str
    claim: str
    description: str
    max_examples: int = 150


PAPER_SEARCHES: tuple[CatalogEntry, ...] = (
    CatalogEntry("grpo_st_stochastic", "B",
                "GRPO (group-std GRAE, token-level PPU), single turn, stochastic outcomes: J decreases"),
    CatalogEntry("grpo_mt_bandit", "C",
                "GRPO, two-turn deterministic sequential bandit: J decreases"),
    CatalogEntry("grpo_mt_stochastic", "C",
                "GRPO, two turns, stochastic outcomes and per-turn rewards: J decreases"),
    CatalogEntry("grae_mean_ppu_st_stochastic", "L-affine",
                "Control: mean-centred GRAE without std scaling + token-level PPU, single turn, stochastic outcomes"),
    CatalogEntry("reinforce_pp_mt_stochastic", "B",
                "REINFORCE++ (batch z-score GRAE, token-level PPU), two turns, stochastic outcomes"),
    CatalogEntry("gspo_mt_token", "C",
                "GSPO (group-std GRAE, whole-trajectory sequence ratio), two turns, token actions"),
    CatalogEntry("gspo_mean_mt_stochastic", "C",
                "GSPO with mean-centred GRAE and a whole-trajectory ratio, two turns, stochastic outcomes"),
    CatalogEntry("gspo_st_stochastic", "T1-GSPO-ST",
                "GSPO, single turn, stochastic outcomes, one-token actions (the sequence ratio equals the token ratio)"),
    CatalogEntry("gspo_st_stochastic_tokens", "T1-GSPO-ST",
                "GSPO, single turn, stochastic outcomes, actions of 2 tokens (the sequence ratio differs from a token ratio)",
                max_examples=400),
    CatalogEntry("gspo_mean_st_stochastic", "T1-GSPO-ST",
                "Control: GSPO with mean-centred GRAE (no std scaling), single turn, stochastic outcomes, 2-token actions"),
    CatalogEntry("seeupo_mt_stochastic", "D",
                "SeeUPO (batch z-score GRAE, reverse HAML), two turns, stochastic outcomes, exact, independent"),
    CatalogEntry("seeupo_mt_shared", "D",
                "SeeUPO with parameters shared across turns and histories (outside the theory)"),
    CatalogEntry("rloo_mt_small_step", "A",
                "RLOO (leave-one-out GRAE, REINFORCE), two turns, stochastic outcomes, step size <= 1"),
    CatalogEntry("rloo_mt_large_step", "A",
                "RLOO, two turns, a large step size (10 or 50): exact tabular softmax PG steps are monotone for any step"),
)
