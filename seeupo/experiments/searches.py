"""The registered counterexample searches: one per algorithm cell without a guarantee, and controls.

Each :class:`SearchSpec` names a hypothesis strategy of :class:`Case` (problem, initial
policy, algorithm settings) and the claim it bears on. ``seeupo search`` runs them and saves
what it finds under ``paper_repro/counterexamples/``; a search that finds nothing is a result
too, recorded with its budget.

The strategies vary what docs/method.md's leads single out: rewards (binary and not), stochastic
outcomes, group size, clip range, step size and epochs, group-std normalisation, per-turn vs
whole-trajectory ratios, shared vs independent parameters, exact vs sampled mode.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hypothesis import strategies as st

from seeupo.core.config import PRESETS, TABLE1_CLIP, AlgorithmConfig, preset
from seeupo.core.registry import adv_estimator, policy_loss
from seeupo.experiments.counterexamples import Case
from seeupo.experiments.search_catalog import PAPER_SEARCHES
from seeupo.tabular.behaviour import Rollouts
from seeupo.tabular.train import RunConfig
from seeupo.tabular.families import AGENTIC_FAMILIES, AGENTIC_FAMILY_TEXT
from seeupo.testing import agentic_mdps, policies, sequential_bandits, token_bandits, tree_mdps


@dataclass(frozen=True)
class SearchSpec:
    name: str
    claim: str
    description: str
    cases: Callable[[], st.SearchStrategy[Case]]
    max_examples: int = 150
    setting: str = ""  # a verify setting (seeupo.experiments.verify.settings) its problems belong to; "" = by turns (ST/MT)


def _settings(draw: st.DrawFn, base: AlgorithmConfig) -> AlgorithmConfig:
    eps = draw(st.sampled_from([0.2, 0.1, 0.3]))
    return base.replace(group_size=draw(st.integers(2, 5)), clip_eps_low=eps, clip_eps_high=eps)


@st.composite
def ppu_cases(
    draw: st.DrawFn,
    base: AlgorithmConfig,
    problems: st.SearchStrategy,
    *,
    parameterization: str = "independent",
    mode: str = "exact",
) -> Case:
    """A PPU-style algorithm (``base``) from a random positive policy, one exact iteration."""
    problem = draw(problems)
    algo = _settings(draw, base).replace(epochs=draw(st.sampled_from([40, 10])))
    run = RunConfig(mode=mode, lr=draw(st.sampled_from([0.05, 0.2])), parameterization=parameterization,
                    init_scale=1.0, seed=draw(st.integers(0, 3)), tasks=4)
    start = draw(policies(problem)) if parameterization == "independent" else None
    return Case(problem, start, algo, run, 1)


@st.composite
def reinforce_cases(draw: st.DrawFn, base: AlgorithmConfig, problems: st.SearchStrategy, lrs: list[float]) -> Case:
    """REINFORCE (one exact policy-gradient step, SGD) with a step size from ``lrs``."""
    problem = draw(problems)
    algo = base.replace(group_size=draw(st.integers(2, 5)))
    return Case(problem, draw(policies(problem)), algo, RunConfig(mode="exact", optimizer="sgd", lr=draw(st.sampled_from(lrs))), 1)


def _stochastic_st() -> st.SearchStrategy:
    return tree_mdps(max_turns=1, max_actions=3, max_observations=2, gamma=1.0, reward_levels=11)


def _stochastic_st_tokens() -> st.SearchStrategy:
    return tree_mdps(max_turns=1, max_observations=2, gamma=1.0, reward_levels=11, tokens=(2, 2))


def _stochastic_mt() -> st.SearchStrategy:
    return tree_mdps(min_turns=2, max_turns=2, max_actions=2, max_observations=2, gamma=1.0, reward_levels=11)


def _bandit_mt() -> st.SearchStrategy:
    return sequential_bandits(min_turns=2, max_turns=2, max_actions=3, max_initial_states=1, reward_levels=3)


# each registered search's strategy, by its name in the catalog (seeupo.experiments.search_catalog), which
# holds its claim, description and budget: `seeupo search --help` lists them without importing this module
_CASES: dict[str, Callable[[], st.SearchStrategy[Case]]] = {
    "grpo_st_stochastic": lambda: ppu_cases(preset("grpo"), _stochastic_st()),
    "grpo_mt_bandit": lambda: ppu_cases(preset("grpo"), _bandit_mt()),
    "grpo_mt_stochastic": lambda: ppu_cases(preset("grpo"), _stochastic_mt()),
    "grae_mean_ppu_st_stochastic": lambda: ppu_cases(preset("grpo", grae_scale="none"), _stochastic_st()),
    "reinforce_pp_mt_stochastic": lambda: ppu_cases(preset("reinforce_pp_baseline"), _stochastic_mt()),
    "gspo_mt_token": lambda: ppu_cases(preset("gspo", **TABLE1_CLIP), token_bandits(min_turns=2, max_turns=2, reward_levels=3)),
    "gspo_mean_mt_stochastic": lambda: ppu_cases(preset("gspo", grae_scale="none", **TABLE1_CLIP), _stochastic_mt()),
    "gspo_st_stochastic": lambda: ppu_cases(preset("gspo", **TABLE1_CLIP), _stochastic_st()),
    "gspo_st_stochastic_tokens": lambda: ppu_cases(preset("gspo", **TABLE1_CLIP), _stochastic_st_tokens()),
    "gspo_mean_st_stochastic": lambda: ppu_cases(preset("gspo", grae_scale="none", **TABLE1_CLIP), _stochastic_st_tokens()),
    "seeupo_mt_stochastic": lambda: ppu_cases(preset("seeupo"), _stochastic_mt()),
    "seeupo_mt_shared": lambda: ppu_cases(preset("seeupo"), _bandit_mt(), parameterization="shared"),
    "rloo_mt_small_step": lambda: reinforce_cases(preset("rloo"), _stochastic_mt(), [0.1, 0.5, 1.0]),
    "rloo_mt_large_step": lambda: reinforce_cases(preset("rloo"), _stochastic_mt(), [10.0, 50.0]),
}
if list(_CASES) != [entry.name for entry in PAPER_SEARCHES]:  # a search added or renamed in one place only
    raise ImportError("seeupo.experiments.searches: the strategies do not match seeupo.experiments.search_catalog")

SEARCHES: list[SearchSpec] = [
    SearchSpec(entry.name, entry.claim, entry.description, _CASES[entry.name], max_examples=entry.max_examples)
    for entry in PAPER_SEARCHES
]


ALGORITHM_CLAIM = "monotone"
"""The claim a generic search bears on: an exact update of the algorithm never lowers ``J``."""


@st.composite
def algorithm_cases(
    draw: st.DrawFn, base: AlgorithmConfig, problems: st.SearchStrategy, *, parameterization: str = "independent",
    rollouts: Rollouts = Rollouts(),
) -> Case:
    """Any registered algorithm (``base``) from a random positive policy, one exact iteration.

    Unlike :func:`ppu_cases`, the algorithm's own clip range and loss are kept: only what a user's
    algorithm leaves to the run varies (group size, optimizer steps, step size, seed). A plain
    policy-gradient loss (not a surrogate) takes one SGD step of size 0.1 to 1, as in
    :func:`reinforce_cases`. An estimator without a closed form over group statistics is
    enumerated over its group-mates' outcomes (:func:`seeupo.tabular.rollout.exact_group_batch`),
    whose size grows fast with ``G``: its groups have at most 3 members. ``rollouts``: the rows come from a stale
    policy or through an engine's sampler; with staleness ``k`` a case runs ``k + 1`` iterations, so that its last
    update reads rows ``k`` updates old.
    """
    problem = draw(problems)
    estimator = adv_estimator(base.advantage)
    largest_group = 5 if estimator.group_stats_closed_form or not estimator.needs_group_stats else 3
    algo = base.replace(group_size=draw(st.integers(2, largest_group)))
    if not policy_loss(algo.update).surrogate:
        run = RunConfig(mode="exact", optimizer="sgd", lr=draw(st.sampled_from([0.1, 0.5, 1.0])),
                        parameterization=parameterization, init_scale=1.0, seed=draw(st.integers(0, 3)),
                        **rollouts.run_fields())  # type: ignore[arg-type]
    else:
        algo = algo.replace(epochs=draw(st.sampled_from([40, 10])))
        run = RunConfig(mode="exact", lr=draw(st.sampled_from([0.05, 0.2])), parameterization=parameterization,
                        init_scale=1.0, seed=draw(st.integers(0, 3)), **rollouts.run_fields())  # type: ignore[arg-type]
    start = draw(policies(problem)) if parameterization == "independent" else None
    return Case(problem, start, algo, run, 1 + rollouts.staleness)


def _any_levels(strategy: Callable[[int], st.SearchStrategy]) -> st.SearchStrategy:
    """Problems with binary, 3-level or 11-level rewards (hypothesis shrinks towards binary)."""
    return st.sampled_from([2, 3, 11]).flatmap(strategy)


def algorithm_searches(name: str, rollouts: Rollouts = Rollouts()) -> list[SearchSpec]:
    """The generic monotonicity searches of the registered algorithm ``name`` (a preset, built in or a plugin's).

    One search per setting: single turn with one-token and two-token actions, two turns on a
    deterministic bandit and with stochastic outcomes and per-turn rewards, two turns with
    parameters shared across turns and histories, and each agentic family of 2 or 3 turns
    (:data:`~seeupo.tabular.families.AGENTIC_FAMILIES`: the agent stops when it chooses,
    intermediate rewards, tool results, token actions); each over problems, reward levels, group
    sizes, step sizes and starting policies (:func:`algorithm_cases`), in exact mode. Their names
    are ``NAME_<setting>`` (``NAME_agentic_<family>`` for a family). ``rollouts``: every case's rows come from
    there (:func:`algorithm_cases`).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown algorithm {name!r}; choose from {sorted(PRESETS)} (a plugin registers more)")
    base = preset(name)

    def drawn(problems: st.SearchStrategy, **kwargs: Any) -> st.SearchStrategy:
        return algorithm_cases(base, problems, rollouts=rollouts, **kwargs)

    settings = [
        ("st_stochastic", "single turn, stochastic outcomes, one-token actions",
         lambda: drawn(_any_levels(lambda k: tree_mdps(max_turns=1, max_actions=3, max_observations=2,
                                                       gamma=1.0, reward_levels=k)))),
        ("st_tokens", "single turn, stochastic outcomes, actions of 2 tokens",
         lambda: drawn(_any_levels(lambda k: tree_mdps(max_turns=1, max_observations=2, gamma=1.0,
                                                       reward_levels=k, tokens=(2, 2))))),
        ("mt_bandit", "two turns, deterministic sequential bandit",
         lambda: drawn(_any_levels(lambda k: sequential_bandits(
             min_turns=2, max_turns=2, max_actions=3, max_initial_states=1, reward_levels=k)))),
        ("mt_stochastic", "two turns, stochastic outcomes and per-turn rewards",
         lambda: drawn(_any_levels(lambda k: tree_mdps(min_turns=2, max_turns=2, max_actions=2,
                                                       max_observations=2, gamma=1.0, reward_levels=k)))),
        ("mt_shared", "two turns, parameters shared across turns and histories",
         lambda: drawn(_any_levels(lambda k: sequential_bandits(
             min_turns=2, max_turns=2, max_actions=3, max_initial_states=1, reward_levels=k)), parameterization="shared")),
    ]
    specs = [SearchSpec(f"{name}_{key}", ALGORITHM_CLAIM, f"{name}: {text}: J decreases", cases, max_examples=60)
             for key, text, cases in settings]
    for family in AGENTIC_FAMILIES:
        specs.append(SearchSpec(
            f"{name}_agentic_{family}", ALGORITHM_CLAIM, f"{name}: 2 or 3 turns, {AGENTIC_FAMILY_TEXT[family]}: J decreases",
            lambda family=family: drawn(_any_levels(lambda k: agentic_mdps(family, reward_levels=k))),
            max_examples=60, setting=family))
    return specs


def get(name: str) -> SearchSpec:
    for spec in SEARCHES:
        if spec.name == name:
            return spec
    raise ValueError(f"unknown search {name!r}; choose from {[s.name for s in SEARCHES]}")


def read_search_index(index: Path) -> dict[str, dict[str, Any]]:
    """The entries of the index ``index`` (a ``searches.json`` that :func:`run_searches` writes) by search
    name, ``{}`` when there is none yet. One that is not a list of search entries is an
    :class:`~seeupo.validation.errors.InputError` naming the file: it is never overwritten."""
    from seeupo.validation.errors import InputError
    from seeupo.validation.files import read_json

    if not index.exists():
        return {}
    entries = read_json(index)
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("search"), str) for e in entries):
        raise InputError(None, "must be a list of search entries; move it away to start a new one", str(index))
    return {e["search"]: e for e in entries}


def earlier_counterexamples(specs: Sequence[SearchSpec], out_dir: Path) -> list[Path]:
    """The counterexample files of ``specs`` already in ``out_dir`` (an earlier run's; :func:`run_searches` saves
    each search's as ``NAME.json``), which a new run would replace."""
    return [out_dir / f"{spec.name}.json" for spec in specs if (out_dir / f"{spec.name}.json").exists()]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_searches(
    specs: Sequence[SearchSpec],
    out_dir: Path,
    index: Path,
    *,
    seed: int,
    max_examples: int | None = None,
    plugins: Sequence[str] = (),
    say: Callable[[str], None] = print,
    progress: Callable[[str], None] = _stderr,
) -> list[dict[str, Any]]:
    """Run each search of ``specs`` in turn, save what it finds as ``out_dir/NAME.json`` and record every
    search run in the index ``index`` (``searches.json``: the entries already there, this run's replacing
    those of the same name).

    ``max_examples`` overrides each search's own budget; ``plugins`` (the plugins loaded for the run) are
    recorded in each entry so that its counterexamples can be replayed. ``progress`` is told when a search
    starts, ``say`` its outcome (:func:`seeupo.experiments.verdicts.search_outcome`). Ctrl-C stops the
    search under way, keeps what it found and stops the run: that entry is the last, marked
    ``"stopped": "interrupted"``, and the index is written all the same. Returns this run's entries.
    """
    from seeupo.experiments.counterexamples import search
    from seeupo.experiments.verdicts import search_outcome
    from seeupo.validation.files import dumps

    existing = read_search_index(index)
    summary = []
    for spec in specs:
        budget = max_examples or spec.max_examples
        progress(f"searching {spec.name} ({budget} examples) ...")
        result = search(spec.cases(), claim=spec.claim, description=spec.description, max_examples=budget, seed=seed,
                        keep_on_interrupt=True, setting=spec.setting)
        entry = {"search": spec.name, "claim": spec.claim, "description": spec.description, "examples": result.examples,
                 "max_examples": budget, "seed": seed, "found": result.found is not None, "moved": result.moved}
        if plugins:
            entry["plugins"] = list(plugins)
        if result.found is not None:
            path = out_dir / f"{spec.name}.json"
            result.found.save(path)
            entry |= {"file": str(path), "J": result.found.J, "largest_decrease": result.found.largest_decrease}
            say(f"{spec.name}: {search_outcome(entry)}; saved {path}")
        else:
            say(f"{spec.name}: {search_outcome(entry)}")
        summary.append(entry)
        if result.stopped == "interrupted":  # Ctrl-C: keep what was found, record it, stop
            entry["stopped"] = "interrupted"
            break
    existing |= {e["search"]: e for e in summary}
    index.write_text(dumps(list(existing.values()), indent=1) + "\n")
    return summary
