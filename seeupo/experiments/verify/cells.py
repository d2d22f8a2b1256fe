"""The cells of ``seeupo verify``: their sizes (:class:`VerifyConfig`), settings, problems, and one cell's run."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from seeupo.core.config import AlgorithmConfig
from seeupo.core.contract import exact_mode_refusal
from seeupo.core.registry import policy_loss
from seeupo.experiments.verdicts import history_outcome, refused_label
from seeupo.experiments.verify.rows import Row
from seeupo.tabular.behaviour import Rollouts
from seeupo.tabular.families import AGENTIC_FAMILIES, AGENTIC_FAMILY_TEXT
from seeupo.tabular.problems import TreeMDP, random_family, random_token_bandit
from seeupo.tabular.train import RunConfig, run


@dataclass(frozen=True)
class VerifyConfig:
    """Size of a verification run.

    instances: random problems per cell (batched in one call).
    iterations: outer iterations per run.
    exact_epochs: optimizer steps per update of a PPU row in exact mode ("maximised to convergence").
    sampled_epochs, sampled_minibatches, tasks: the sampled mode's update, as an LLM run.
    sampled_iterations_factor: sampled runs take this many times more (cheaper, noisier) iterations.
    turns_mt: turns of the multi-turn setting (single-turn has 1).
    families: the agentic problem families (:data:`seeupo.tabular.families.AGENTIC_FAMILIES`: the
      agent stops when it chooses, intermediate rewards, tool results, token actions), each a setting
      of its own beside ST and MT, run in exact mode only (sampled mode adds sampling noise and
      nothing the exact cell does not measure) with every parameterisation; ``()`` for none.
    turns_agentic: turns of the agentic settings (the agent may stop before the last).
    vocab_size, length: actions are ``length`` tokens from ``vocab_size``.
    reward_levels: rewards on that many evenly spaced levels in [0, 1] (2 = binary).
    group_size: ``G`` for GRAE.
    modes, parameterizations: which columns to run.
    tol, gap_tol: a decrease larger than ``tol`` is a violation; ``gap_tol`` is "reached J*".
    stall_ratio: an instance whose gap fell by less than this fraction over the last third of
      the run has stopped improving.
    workers: processes.
    counterexample_dir: saved counterexamples replayed for Table 1 (relative to the working
      directory, else to the repository root); ``""`` to ignore them.
    algorithm_counterexamples: folders of counterexample files (or ``seeupo check`` folders)
      consulted for the ``algorithms`` rows: each file whose algorithm is one of them is replayed
      (:func:`algorithm_counterexample_files`).
    grid: ``"table1"`` (the paper's rows and SeeUPO's order ablations) or ``"full"`` (every
      advantage estimator x every update; see :func:`full_grid_rows`).
    algorithms: registered algorithms (preset names) to run instead of ``grid``
      (:func:`algorithm_rows`); an estimator that exact mode refuses
      (:func:`seeupo.core.contract.exact_mode_refusal`) gets sampled cells only.
    plugins: the plugins that registered them (``NAME@sha256:HEX``, :mod:`seeupo.plugins`),
      loaded by every worker process and recorded in the report.
    rollouts: where every cell's rows come from (:class:`seeupo.tabular.behaviour.Rollouts`: staleness and the
      engine's sampler; on policy by default); the algorithm's ``correction`` reweights them.
    """

    instances: int = 12
    iterations: int = 15
    exact_epochs: int = 40
    sampled_epochs: int = 2
    sampled_minibatches: int = 2
    tasks: int = 4
    sampled_iterations_factor: int = 4
    turns_mt: int = 2
    families: tuple[str, ...] = tuple(AGENTIC_FAMILIES)
    turns_agentic: int = 2
    vocab_size: int = 2
    length: int = 2
    reward_levels: int = 3
    group_size: int = 4
    modes: tuple[str, ...] = ("exact", "sampled")
    parameterizations: tuple[str, ...] = ("independent", "shared")
    tol: float = 1e-7
    gap_tol: float = 1e-3
    stall_ratio: float = 0.05
    workers: int = 2
    seed: int = 0
    grid: str = "table1"
    counterexample_dir: str = "paper_repro/counterexamples"
    algorithm_counterexamples: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()
    rollouts: Rollouts = Rollouts()


QUICK = VerifyConfig(instances=6, iterations=8, exact_epochs=25, modes=("exact",), parameterizations=("independent",))


@dataclass
class CellResult:
    row: str
    setting: str
    mode: str
    parameterization: str
    instances: int
    iterations: int
    violations: int
    max_violation: float
    max_final_gap: float
    mean_final_gap: float
    verdict: str
    worst_instance: int
    worst_J: list[float]
    J_star_worst: float
    seconds: float
    note: str = ""  # sampled mode: the J decreases, which are sampling noise
    refused: str | None = None  # exact mode refused the estimator: why (the cell did not run)
    random_instances: str = ""  # the random instances' own outcome, when a replaying counterexample decided the verdict
    counterexamples: list[str] = dataclasses.field(default_factory=list)  # files of those counterexamples


def refused_cell(row: Row, setting: str, parameterization: str, cfg: VerifyConfig, reason: str) -> CellResult:
    """The record of an exact cell that exact mode refused to run: no numbers, the reason."""
    return CellResult(row.name, setting, "exact", parameterization, 0, 0, 0, 0.0, float("nan"), float("nan"),
                      refused_label(reason), 0, [], float("nan"), 0.0, refused=reason)


def exact_refusal(config: AlgorithmConfig, group_size: int) -> str | None:
    """Why exact mode refuses ``config``'s estimator with groups of ``group_size``, or ``None`` when it runs it
    (:func:`seeupo.core.contract.exact_mode_refusal`: ``registered with exact=False``, or a failed check
    of what exact mode assumes, such as symmetry in the group)."""
    return exact_mode_refusal(config.replace(group_size=group_size))


BASE_SETTINGS = ("ST", "MT")
"""The paper's settings (Table 1): one turn, and ``turns_mt`` turns, on random token bandits."""


def settings(cfg: VerifyConfig) -> tuple[str, ...]:
    """Every setting a cell may have: :data:`BASE_SETTINGS`, then ``cfg.families``."""
    return (*BASE_SETTINGS, *cfg.families)


def setting_runs(cfg: VerifyConfig, setting: str, sequential: bool) -> list[tuple[str, str]]:
    """``(mode, parameterization)`` of the cells of ``setting``: none for a single turn of a sequential
    update (nothing to order), exact mode only for an agentic family (:class:`VerifyConfig`)."""
    if setting == "ST" and sequential:
        return []
    modes = [m for m in cfg.modes if setting in BASE_SETTINGS or m == "exact"]
    return [(mode, param) for mode in modes for param in cfg.parameterizations]


def setting_text(setting: str) -> str:
    """A setting in words (a family's from :data:`~seeupo.tabular.families.AGENTIC_FAMILY_TEXT`)."""
    return {"ST": "single turn", "MT": "multi-turn token bandit"}.get(setting) or AGENTIC_FAMILY_TEXT[setting]


def make_problems(cfg: VerifyConfig, turns: int) -> TreeMDP:
    """The random token bandits of the ST (``turns`` 1) and MT settings."""
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + turns)
    return random_token_bandit(cfg.instances, turns, cfg.vocab_size, cfg.length, reward_levels=cfg.reward_levels, generator=gen)


def setting_problems(cfg: VerifyConfig, setting: str) -> TreeMDP:
    """The batch of random problems a cell of ``setting`` trains on (seeded by the config and the setting)."""
    if setting in BASE_SETTINGS:
        return make_problems(cfg, 1 if setting == "ST" else cfg.turns_mt)
    index = list(AGENTIC_FAMILIES).index(setting)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + 100 + 10 * index + cfg.turns_agentic)
    return random_family(setting, cfg.instances, cfg.turns_agentic, reward_levels=cfg.reward_levels, generator=gen)


def run_cell(row: Row, setting: str, mode: str, parameterization: str, cfg: VerifyConfig) -> CellResult:
    """Train ``row`` on a batch of random problems and judge the run."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    problem = setting_problems(cfg, setting)
    algo = row.config.replace(group_size=cfg.group_size)
    if mode == "sampled" and policy_loss(algo.update).surrogate:
        algo = algo.replace(epochs=cfg.sampled_epochs, minibatches=cfg.sampled_minibatches)
    iterations = cfg.iterations * row.iterations_factor * (cfg.sampled_iterations_factor if mode == "sampled" else 1)
    iterations += cfg.rollouts.staleness  # with staleness K, K more updates: the cell's own then read stale rows
    run_cfg = RunConfig(
        mode=mode, iterations=iterations, tasks=cfg.tasks, optimizer=row.optimizer, lr=row.lr,
        parameterization=parameterization, seed=cfg.seed, **cfg.rollouts.run_fields(),  # type: ignore[arg-type]
    )
    hist = run(problem, algo, run_cfg)
    viol = hist.violations(cfg.tol)
    gap = hist.gap[-1]
    # where J is not finite, argmax of a NaN gap is arbitrary: show the first instance then
    finite_gap = torch.nan_to_num(gap, nan=-1.0)
    worst = int((viol.max(0).values if bool((viol > 0).any()) else finite_gap).argmax())
    outcome = history_outcome(hist, mode, tol=cfg.tol, gap_tol=cfg.gap_tol, stall_ratio=cfg.stall_ratio)
    n_viol, verdict, note = outcome["J_decreases"], outcome["measured"], outcome["note"]
    return CellResult(
        row.name, setting, mode, parameterization, cfg.instances, iterations, n_viol, float(viol.max()),
        float(gap.max()), float(gap.mean()), verdict, worst, hist.J[:, worst].tolist(), float(hist.J_star[worst]),
        time.perf_counter() - start, note,
    )


def _load_plugins(specs: tuple[str, ...]) -> None:
    """A worker process imports the plugins (pinned to their recorded hashes) before it runs a cell."""
    from seeupo.plugins import load_plugins

    load_plugins(list(specs), "--plugin")
