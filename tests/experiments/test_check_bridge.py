"""The bridge part of ``seeupo check`` learns, says what the checked algorithm did, and refuses to be vacuous.

Measured settings (``check.QUICK``: tiny Qwen3, seed 0, warm-up to P(valid first answer) >= 0.9,
3 steps at lr 1e-3, 4 x 4 rollouts): the warm-up stops after 25 steps at P = 0.932, and the
exact J rises 0.392 -> 0.609 with ``grpo`` and 0.392 -> 0.631 with ``seeupo``; an estimator of
zeros leaves it at 0.392 exactly. The margins asserted below are half the measured rises.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("transformers")

from seeupo import plugins  # noqa: E402
from seeupo.experiments import check  # noqa: E402

ZERO_PLUGIN = '''
"""An estimator with no signal: zero advantage everywhere."""
import torch

from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est


@register_adv_est("all_zero", needs_group_stats=True)
def all_zero(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
    return torch.zeros_like(batch.logp_old)


register_preset(preset("grpo", name="zero_grpo", advantage="all_zero"))
'''


@pytest.fixture
def zero_plugin(tmp_path):
    plugins.forget_plugins()
    path = tmp_path / "zero_plugin.py"
    path.write_text(ZERO_PLUGIN)
    yield plugins.load_plugins([str(path)], "--plugin")
    plugins.forget_plugins()


@pytest.mark.slow
def test_quick_bridge_warms_up_and_the_builtins_learn_beside_a_plugin_that_does_not(tmp_path, zero_plugin):
    result = check.run_bridge("zero_grpo", check.QUICK, tmp_path, zero_plugin, say=lambda _: None)
    warm = result.warmup
    assert warm.p_valid >= 0.9 and warm.threshold == 0.9  # the recorded exact probability
    assert all(w["p_valid"] >= 0.9 and 0 < w["steps"] <= check.QUICK.bridge_warmup for w in warm.seeds)
    assert result.vacuous is None
    learnt = result.learning
    assert learnt["grpo"].moved == "raised" and learnt["grpo"].change_mean > 0.1
    assert learnt["seeupo"].moved == "raised" and learnt["seeupo"].change_mean > 0.1
    assert learnt["zero_grpo"].moved == "unchanged" and abs(learnt["zero_grpo"].change_mean) < 1e-6
    assert result.summary.startswith("zero_grpo left J where it was") and "grpo raised J" in result.summary
    # the same seeds and warm-up: every algorithm starts from the same exact J
    starts = {r["J"][0] for r in result.runs} | {r["J"][0] for b in result.baselines.values() for r in b["runs"]}
    assert len(starts) == 1
    assert set(result.baselines) == {"grpo", "seeupo"}
    assert check.BridgeResult.from_dict(result.to_dict()) == result
    assert "left J where it was" in "\n".join(check.bridge_markdown(result))


def test_learning_words_and_tolerance():
    def runs(*pairs):
        return [{"J_initial": a, "J_final": b} for a, b in pairs]

    assert check.learning(runs((0.4, 0.405), (0.3, 0.31))).moved == "unchanged"  # mean change +0.0075 < 0.01
    raised = check.learning(runs((0.4, 0.6)))
    assert raised.moved == "raised" and raised.words.startswith("raised J from 0.4000 to 0.6000")
    assert check.learning(runs((0.4, 0.2))).moved == "lowered"


@pytest.mark.slow
def test_a_failed_warm_up_makes_the_bridge_vacuous_and_check_exit_non_zero(tmp_path, monkeypatch, capsys):
    from seeupo.cli import main

    no_warmup = dataclasses.replace(check.QUICK, bridge_warmup=0, max_examples=1,
                                    verify=dataclasses.replace(check.QUICK.verify, instances=1, iterations=2))
    result = check.run_bridge("grpo", no_warmup, tmp_path / "direct", (), say=lambda _: None)
    assert result.warmup.p_valid < 0.9 and result.warmup.steps == 0
    assert result.vacuous.startswith("the format warm-up reached P(valid first answer) = 0.0000")
    assert result.learning == {} and not (tmp_path / "direct" / "bridge").exists()  # nothing trained

    monkeypatch.setattr(check, "QUICK", no_warmup)
    out = tmp_path / "check"
    assert main(["check", "grpo", "--quick", "--no-progress", "--out", str(out)]) == 1
    assert "the bridge is vacuous: the format warm-up reached P(valid first answer)" in capsys.readouterr().err
    report = json.loads((out / "check.json").read_text())
    assert report["bridge"]["vacuous"] == result.vacuous
    assert "**vacuous**" in (out / "check.md").read_text()
