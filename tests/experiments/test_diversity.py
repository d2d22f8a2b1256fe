"""Entropy and pass@k along an algorithm's own exact updates (seeupo.experiments.diversity), on a small run."""

from __future__ import annotations

import torch

from seeupo.experiments.diversity import RIGHT, markdown, right_answers_bandit, run_algorithm, summary
from seeupo.tabular.exact import optimal


def test_right_answers_bandits_have_three_right_answers_per_prompt():
    problem = right_answers_bandit(3, seed=1, prompts=4)
    rewards = problem.rewards[0][..., 0]  # [I, S0, A]
    assert bool((rewards.sum(-1) == RIGHT).all()) and torch.equal(optimal(problem).J, torch.ones(3, dtype=torch.float64))


def test_a_run_records_the_history_and_its_summary_reads_it():
    """RLOO's exact updates on 4 prompts sharing parameters: pass@1 rises from 3/8; the summary's last row is the
    history's; the covariance identity predicts the sign of each update's entropy change."""
    problem = right_answers_bandit(2, seed=0, prompts=4)
    run = run_algorithm("rloo", problem, updates=3, parameterization="shared")
    history = run["history"]
    assert len(history) == 4 and abs(history[0]["pass"][0][0] - 3 / 8) < 1e-12
    row = summary(run, optimal(problem).J.tolist())
    last = sum(p[0] for p in history[-1]["pass"]) / 2
    assert abs(row["last"]["pass@1"] - last) < 1e-12 and last > 3 / 8
    ident = row["identity"]
    assert ident["updates"] > 0 and ident["same_sign"] == ident["updates"]
    report = {"settings": {"seed": 0, "instances": 2, "updates": 3}, "settings_measured": {"small": {"rloo": row}},
              "seconds": 1.0}
    assert "| rloo | " in markdown(report)
