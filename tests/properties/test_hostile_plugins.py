"""Hostile plugins (issue 23, item 9): generated advantage estimators and policy losses, each broken in
one way, run through ``check --quick --no-bridge``, ``verify --algorithms`` and one ``train`` step.

Each command must answer in one of two ways, and nothing else:

* exit 2 with one stderr line ``seeupo CMD: error: ...`` naming the broken function and its file, no
  traceback, and the output folder untouched (a ``train`` run that broke after it began may instead
  be complete: its folder holds ``failed.txt`` with that line);
* a verdict that names the defect (``exact: refused (not symmetric in its group)``, ``no learning
  signal``), with its output folder complete; never ``monotone`` or ``converges`` for the broken
  algorithm.

An exception that escapes ``seeupo.cli.main`` is a toolkit traceback and fails the test. The defects:
non-finite values at random valid positions (or wherever a group's returns tie), wrong shapes,
dtypes and devices, Python lists, numbers, ``None``, an exception, the batch (or the advantages)
changed in place, a loss without gradient; and two that no boundary check can see on one call and that
the verdict must name instead: advantages that depend on a trajectory's position in its group, and
advantages that are all zero. A loss that depends on row order is not generated: nothing in the
contract of a loss forbids it (exact mode's symmetry assumption is the estimator's).

The default test runs the commands in-process (``main([...])``, stdout and stderr captured) on the
defects the boundary names, the profile's examples (15 under `ci`: about 20 s on 2 shared cores); the ``slow`` variant draws every
defect, the verdict ones included, and runs every command as a real process (``verify`` with two
spawned workers, so that a worker's error must reach the parent as the same one line). The verdict
defects also run in-process (``test_a_defect_no_single_call_shows_is_the_verdict``, slow: 10-20 s each).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seeupo import plugins
from seeupo.cli import main

PLUGIN = '''import torch
from seeupo.core.advantages import broadcast_to_tokens
from seeupo.core.batch import per_trajectory, segment_sum
from seeupo.core.config import preset, register_preset
from seeupo.core.registry import register_adv_est, register_policy_loss


def valid_positions(batch, k, seed):
    """k random (row, token) positions among the real tokens of valid rows."""
    pos = (batch.token_mask & batch.valid[:, None]).nonzero()
    return pos[torch.randperm(len(pos), generator=torch.Generator().manual_seed(seed))[:k]]


@register_adv_est("user_adv", needs_group_stats=True)
def user_adv(batch, cfg, *, critic_values=None, oracle=None, group_stats=None):
    """RLOO-like centred return, broken below on purpose."""
    r, g = per_trajectory(batch.traj_return, batch), per_trajectory(batch.group_id, batch)
    mean = segment_sum(r, g, batch.num_groups) / cfg.group_size
    good = broadcast_to_tokens((r - mean[g])[batch.traj_id], batch)
{adv}


@register_policy_loss("user_loss", surrogate=False)
def user_loss(logp_new, batch, adv, cfg):
    """REINFORCE, broken below on purpose."""
    objective = logp_new * adv
{loss}


register_preset(preset("rloo", name="user_algo", advantage="user_adv", update="user_loss"))
'''
GOOD_ADV = "    return good"
GOOD_LOSS = "    return objective, None"
FORBIDDEN = ("monotone", "converges")  # verdicts a broken algorithm must never get


@dataclass(frozen=True)
class Defect:
    """One broken function: its body, which function is broken, and what the commands must say."""

    name: str
    adv: str = GOOD_ADV
    loss: str = GOOD_LOSS
    named: str = ""  # the broken function as the error line names it; "" when a verdict must name the defect
    verdict: str = ""  # the words of that verdict

    def source(self) -> str:
        return PLUGIN.format(adv=self.adv, loss=self.loss)


def _adv(name: str, body: str) -> Defect:
    return Defect(name, adv=body, named="advantage estimator 'user_adv' (")


def _loss(name: str, body: str) -> Defect:
    return Defect(name, loss=body, named="policy loss 'user_loss' (")


@st.composite
def nonfinite(draw: st.DrawFn, target: str) -> Defect:
    """NaN or +-inf at 1 to 3 random valid positions of the advantages or of the objective."""
    value = draw(st.sampled_from(["nan", "inf", "-inf"]))
    k, seed = draw(st.integers(1, 3)), draw(st.integers(0, 2**16))
    if target == "adv":
        return _adv(f"adv_{value}_{k}", f"    out = good.clone()\n    p = valid_positions(batch, {k}, {seed})\n"
                                        f"    out[p[:, 0], p[:, 1]] = float('{value}')\n    return out")
    return _loss(f"loss_{value}_{k}", f"    p = valid_positions(batch, {k}, {seed})\n"
                                      "    bad = torch.zeros_like(objective, dtype=torch.bool)\n"
                                      "    bad[p[:, 0], p[:, 1]] = True\n"
                                      f"    return torch.where(bad, float('{value}'), objective), None")


# the defects the boundary names on their first call
ADV_DEFECTS = st.one_of(
    nonfinite("adv"),
    st.sampled_from([
        # a std scaling without its epsilon: NaN exactly where a group's returns tie
        _adv("nan_on_ties", "    sd = (segment_sum((r - mean[g]) ** 2, g, batch.num_groups) / cfg.group_size).sqrt()\n"
                            "    return broadcast_to_tokens(((r - mean[g]) / sd[g])[batch.traj_id], batch)"),
        _adv("per_trajectory", "    return (r - mean[g])"),
        _adv("first_token", "    return good[:, :1]"),
        _adv("flat", "    return good.reshape(-1)"),
        _adv("extra_dim", "    return good[None]"),
        _adv("long", "    return good.round().long()"),
        _adv("bool", "    return good > 0"),
        _adv("complex", "    return good.to(torch.complex64)"),
        _adv("meta_device", "    return good.to('meta')"),
        _adv("list", "    return good.tolist()"),
        _adv("none", "    return None"),
        _adv("float", "    return 0.5"),
        _adv("int", "    return 1"),
        _adv("tuple", "    return good, None"),
        _adv("numpy", "    return good.numpy()"),
        _adv("raise_value", "    raise ValueError('rank of an empty group')"),
        _adv("raise_zero", "    return good / 0 if 1 / 0 else good"),
        _adv("raise_in_torch", "    return good + torch.ones(3)"),
        _adv("mutate_return", "    batch.traj_return.mul_(2.0)\n    return good"),
        _adv("mutate_reward", "    batch.reward.add_(1.0)\n    return good"),
        _adv("mutate_logp", "    batch.logp_old.zero_()\n    return good"),
        _adv("mutate_weight", "    batch.weight.mul_(0.5)\n    return good"),
        _adv("reassign", "    batch.reward = batch.reward * 2\n    return good"),
    ]),
)
LOSS_DEFECTS = st.one_of(
    nonfinite("loss"),
    st.sampled_from([
        _loss("detached", "    return objective.detach(), None"),
        _loss("no_grad", "    with torch.no_grad():\n        out = logp_new * adv\n    return out, None"),
        _loss("constant", "    return torch.zeros_like(logp_new), None"),
        _loss("summed_rows", "    return objective.sum(1), None"),
        _loss("scalar", "    return objective.mean(), None"),
        _loss("not_a_pair", "    return objective"),
        _loss("triple", "    return objective, None, None"),
        _loss("none", "    return None"),
        _loss("list", "    return objective.tolist(), None"),
        _loss("float_clip_mask", "    return objective, torch.zeros_like(objective)"),
        _loss("clip_mask_shape", "    return objective, torch.zeros(objective.shape[0], dtype=torch.bool)"),
        _loss("raise", "    raise RuntimeError('clip range not set')"),
        _loss("mutate_adv", "    adv.mul_(2.0)\n    return objective, None"),
        _loss("mutate_logp_old", "    batch.logp_old.add_(1.0)\n    return objective, None"),
    ]),
)
# the defects no check of one call can see: the verdict must name them (each check costs 10-20 s: slow only)
VERDICT_CASES = [
    Defect("position_dependent",
           adv="    first = torch.full((batch.num_groups,), r.numel()).scatter_reduce(0, g, torch.arange(r.numel()), 'amin')\n"
               "    return broadcast_to_tokens((r - r[first][g])[batch.traj_id], batch)",
           verdict="exact: refused (not symmetric in its group)"),
    Defect("all_zero", adv="    return torch.zeros_like(good)", verdict="no learning signal"),
]
VERDICT_DEFECTS = st.sampled_from(VERDICT_CASES)
NAMED = st.one_of(ADV_DEFECTS, LOSS_DEFECTS)

SMALL_TRAIN = ["rollout.tasks_per_step=2", "algorithm.group_size=2", "env.options.warmup_steps=0",
               "env.options.num_tasks=4", "logging.progress=false", "steps=1", "checkpoint.every=1"]


@dataclass
class Outcome:
    command: str
    code: int
    stdout: str
    stderr: str
    out: Path


def _in_process(command: str, argv: list[str], out: Path) -> Outcome:
    """``main(argv)`` with stdout and stderr captured; an exception escaping it fails the test (a toolkit traceback)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    plugins.forget_plugins()  # what a new process sees: only the built-ins
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(argv)
    finally:
        plugins.forget_plugins()
    return Outcome(command, code, stdout.getvalue(), stderr.getvalue(), out)


def _subprocess(command: str, argv: list[str], out: Path, cwd: Path) -> Outcome:
    proc = subprocess.run([sys.executable, "-m", "seeupo", *argv], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return Outcome(command, proc.returncode, proc.stdout, proc.stderr, out)


def _commands(folder: Path, plugin: str) -> dict[str, tuple[list[str], Path]]:
    sets = [a for s in SMALL_TRAIN for a in ("--set", s)]
    return {
        "check": (["check", "user_algo", "--plugin", plugin, "--quick", "--no-bridge", "--no-progress",
                   "--out", str(folder / "check")], folder / "check"),
        "verify": (["verify", "--algorithms", "user_algo", "--plugin", plugin, "--quick", "--instances", "2",
                    "--iterations", "2", "--no-progress", "--out", str(folder / "verify")], folder / "verify"),
        "train": (["train", "--plugin", plugin, "--set", "algorithm.preset=user_algo", *sets, "--no-progress",
                   "--out", str(folder / "run")], folder / "run"),
    }


def _judge(defect: Defect, result: Outcome, plugin: str) -> None:
    """The answer of one command to one broken plugin is one of the two allowed (module docstring)."""
    where = f"{defect.name}: seeupo {result.command} exited {result.code}\nstdout: {result.stdout[-2000:]}\nstderr: {result.stderr}"
    if result.code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, where
        assert lines[0].startswith(f"seeupo {result.command}: error: "), where
        if defect.named:
            assert defect.named in lines[0] and plugin in lines[0], where
        # untouched, or (a run that broke after it began) complete and marked failed
        assert not result.out.exists() or (result.command == "train" and (result.out / "failed.txt").exists()), where
        return
    assert not defect.named, where  # the boundary names it on its first call: no command may answer otherwise
    assert result.code in (0, 1) and "Traceback" not in result.stderr, where
    if result.command == "check":
        report = json.loads((result.out / "check.json").read_text())
        measured = report["monotonicity"]["measured"] or ""
        words = " ".join([measured, *report["monotonicity"]["evidence"]])
        assert defect.verdict in words and not any(w in measured for w in FORBIDDEN), where
        assert (result.out / "check.md").exists(), where
        summary = result.stdout.strip().splitlines()[-2]  # "user_algo: <verdict>", then "Wrote ..."
        assert summary.startswith("user_algo: ") and defect.verdict in summary, where
        assert not any(w in summary for w in FORBIDDEN), where
    elif result.command == "verify":
        report = json.loads((result.out / "verify.json").read_text())
        ours = [c for c in report["cells"] if c["row"] == "user_algo"]
        assert all(defect.verdict in c["verdict"] for c in ours), where
        assert not any(w in c["verdict"] for c in ours for w in FORBIDDEN), where
        assert (result.out / "verify.md").exists(), where
    else:  # train gives no verdict; its folder is a complete run
        assert result.code == 0, where
        assert {"config.yaml", "metrics.jsonl", "checkpoints"} <= {p.name for p in result.out.iterdir()}, where
        assert not (result.out / "failed.txt").exists(), where


def _run_all(defect: Defect, *, real_processes: bool) -> None:
    """Each command on ``defect``'s plugin, in-process or (``real_processes``) as ``python -m seeupo`` with
    ``verify``'s two spawned workers, each answer judged by :func:`_judge`."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plugin = folder / f"hostile_{defect.name.replace('-', 'minus_')}.py"
        plugin.write_text(defect.source())
        cwd = os.getcwd()
        os.chdir(folder)  # the error line names the plugin relative to the working directory
        try:
            for command, (argv, out) in _commands(folder, plugin.name).items():
                if real_processes:  # check's own searches use hypothesis, which may not nest inside this test's
                    result = _subprocess(command, [*argv, "--workers", "2"] if command == "verify" else argv, out, folder)
                else:
                    result = _in_process(command, [*argv, "--workers", "1"] if command == "verify" else argv, out)
                _judge(defect, result, plugin.name)
        finally:
            os.chdir(cwd)


@settings(max_examples=settings.default.max_examples)
@given(defect=NAMED)
def test_a_hostile_plugin_is_named_in_one_line_by_check_verify_and_train(defect):
    _run_all(defect, real_processes=False)


@pytest.mark.slow
@settings(max_examples=max(12, settings.default.max_examples // 8))  # 12 under ci, 25 under thorough: ~10 s each
@given(defect=st.one_of(NAMED, VERDICT_DEFECTS))
def test_a_hostile_plugin_is_named_or_its_defect_is_the_verdict_thorough(defect):
    _run_all(defect, real_processes=True)


@pytest.mark.slow
@pytest.mark.parametrize("defect", VERDICT_CASES, ids=lambda d: d.name)
def test_a_defect_no_single_call_shows_is_the_verdict(defect):
    _run_all(defect, real_processes=False)
