"""The trainer: every preset runs end to end on the bridge, resume after kill -9 is exact, divergence stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("transformers")

from seeupo.cli import main  # noqa: E402
from seeupo.llm.config import load_train_config  # noqa: E402
from seeupo.llm.metrics import read_metrics  # noqa: E402
from seeupo.llm.trainer import Trainer  # noqa: E402

SMALL = ["rollout.tasks_per_step=2", "algorithm.group_size=2", "env.options.warmup_steps=5", "env.options.num_tasks=4",
         "optim.lr=3e-3", "logging.progress=false"]
VERL_KEYS = {"actor/pg_loss", "actor/pg_clipfrac", "actor/kl_loss", "actor/grad_norm", "actor/lr", "critic/score/mean",
             "response_length/mean", "timing_s/gen", "timing_s/update_actor", "perf/throughput", "bridge/J", "bridge/J_star"}


@pytest.mark.parametrize("preset", ["ppo", "grpo", "gspo", "rloo", "reinforce_pp", "seeupo"])
def test_every_preset_trains_on_the_bridge(preset, tmp_path):
    cfg = load_train_config(None, SMALL + [f"algorithm.preset={preset}", "steps=2", f"out_dir={tmp_path}", "logging.m_final=true"])
    history = Trainer(cfg).train()
    assert len(history) == 2
    assert VERL_KEYS <= set(history[-1])
    if preset == "ppo":
        assert "critic/vf_loss" in history[-1]
    if preset == "seeupo":
        assert "seeupo/m_final_mean" in history[-1]
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]  # step 0: the initial exact J
    assert all(v is not None for r in records[1:] for v in r.values())
    assert 0.0 <= records[-1]["bridge/J"] <= records[-1]["bridge/J_star"] + 1e-9


def test_a_run_logs_no_transformers_deprecation(tmp_path):
    """transformers >= 5.24 logs "`past_key_values`/`cache_params` are deprecated" (once per process,
    through its logger) when a caller names the cache the old way; a run reads and passes ``cache``."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    library = logging.getLogger("transformers")  # its modules' loggers propagate to it
    logging.Logger.warning_once.cache_clear()  # an earlier test may have logged it already
    library.addHandler(handler)
    try:
        cfg = load_train_config(None, SMALL + ["algorithm.preset=seeupo", "steps=1", f"out_dir={tmp_path}"])
        Trainer(cfg).train()
    finally:
        library.removeHandler(handler)
    assert not [r.getMessage() for r in records if "deprecated" in r.getMessage()]


def test_a_sequential_run_logs_whether_its_ratio_passes_were_fused(tmp_path):
    import warnings

    def run(name, *extra):
        cfg = load_train_config(None, SMALL + ["algorithm.preset=seeupo", *extra, f"out_dir={tmp_path / name}"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = Trainer(cfg).train()
        return [h["actor/fused_ratio_passes"] for h in history], [str(w.message) for w in caught if "not fused" in str(w.message)]

    assert run("fused", "steps=1") == ([1.0], [])
    fused, warned = run("unfused", "steps=2", "algorithm.minibatches=2")
    assert fused == [0.0, 0.0]
    assert len(warned) == 1 and warned[0].startswith("ratio passes not fused: minibatches=2 > 1")  # once per run


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in records]


def _train_cmd(config, out, *extra):
    return [sys.executable, "-m", "seeupo.cli", "train", str(config), "--out", str(out), "--no-progress", *extra]


@pytest.mark.slow
def test_resume_after_kill_9_reproduces_the_uninterrupted_run(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("steps: 6\ncheckpoint: {every: 2, keep: 2}\n")
    sets = [a for s in SMALL for a in ("--set", s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    whole = subprocess.run(_train_cmd(config, tmp_path / "whole", *sets), env=env, capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr
    # the same run, killed with SIGKILL once step 3 is logged (a checkpoint exists at step 2)
    cut = tmp_path / "cut"
    proc = subprocess.Popen(_train_cmd(config, cut, *sets), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if any(r["step"] >= 3 for r in read_metrics(cut)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert max(r["step"] for r in read_metrics(cut)) < 6
    resumed = subprocess.run(_train_cmd(config, cut, *sets, "--resume"), env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert [r["step"] for r in read_metrics(cut)] == list(range(7))
    assert _comparable(read_metrics(cut)) == _comparable(read_metrics(tmp_path / "whole"))


def test_non_finite_steps_stop_the_run_with_a_checkpoint(tmp_path):
    # an environment whose rewards are NaN (a broken reward function): every loss is NaN
    import torch

    from seeupo.llm.agent import StepResult
    from seeupo.llm.trainer import TrainingDiverged

    cfg = load_train_config(None, SMALL + ["steps=5", "optim.max_non_finite=2", f"out_dir={tmp_path}"])
    trainer = Trainer(cfg)
    make = trainer.env.make

    class NaNReward:
        def __init__(self, generator):
            self.env = make(generator)

        def reset(self, task):
            return self.env.reset(task)

        def step(self, text, token_ids):
            result = self.env.step(text, token_ids)
            return StepResult(result.observation, float("nan"), result.done, result.info)

    trainer.env.make = NaNReward
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(TrainingDiverged, match="2 optimizer steps in a row had a non-finite loss or gradient"):
        trainer.train()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["actor/skipped_steps"] == r["actor/optimizer_steps"] > 0 for r in records[1:])
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))  # no step was taken
    assert (tmp_path / "checkpoints" / "step_00000002" / "state.pt").exists()


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    assert main(["train", "--set", "optim.lrr=1", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.optim.lrr" in err and "expected ['beta1'" in err
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.jsonl").write_text("")
    assert main(["train", "--out", str(tmp_path / "b")]) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err
    config = tmp_path / "bad.yaml"
    config.write_text("env: {name: atari}\n")
    assert main(["train", str(config), "--out", str(tmp_path / "c")]) == 2
    assert "unknown environment 'atari'" in capsys.readouterr().err


def test_example_configs_load():
    from pathlib import Path

    configs = sorted(Path(__file__).parents[2].joinpath("configs").glob("*.yaml"))
    assert configs
    for path in configs:
        cfg = load_train_config(path)
        assert cfg.steps >= 1, path
        json.dumps(cfg.to_dict())


def _hashes(folder):
    import hashlib
    from pathlib import Path

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def _one_line(capsys):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_resume_refuses_another_config_and_logs_allowed_changes(tmp_path, capsys):
    run = tmp_path / "run"
    sets = [a for s in SMALL + ["steps=2", "checkpoint.every=1"] for a in ("--set", s)]
    # --resume-if-possible on a folder that does not exist yet: a fresh run
    assert main(["train", *sets, "--out", str(run), "--no-progress", "--resume-if-possible"]) == 0
    capsys.readouterr()
    before = _hashes(run)
    config_text = (run / "config.yaml").read_text()
    # a SeeUPO run resumed as GRPO, in float64, on another bridge problem: refused, nothing touched
    for change, listed in [("algorithm.preset=grpo", "algorithm.preset: 'seeupo' -> 'grpo'"),
                           ("model.dtype=float64", "model.dtype: 'float32' -> 'float64'"),
                           ("env.options.problem_seed=5", "env.options.problem_seed: 0 -> 5")]:
        assert main(["train", *sets, "--set", change, "--set", "steps=3", "--out", str(run), "--resume"]) == 2
        err = _one_line(capsys)
        assert listed in err and "steps" not in err.split(" (only")[0], err
        assert _hashes(run) == before
    # more steps and another checkpoint cadence may change: the run goes on, config.yaml stays, the change is logged
    assert main(["train", *sets, "--set", "steps=3", "--set", "checkpoint.every=5", "--out", str(run), "--no-progress", "--resume"]) == 0
    assert (run / "config.yaml").read_text() == config_text
    log = [json.loads(line) for line in (run / "resume_log.jsonl").read_text().splitlines()]
    assert len(log) == 1 and log[0]["resumed_from_step"] == 2
    assert log[0]["changes"] == {"checkpoint.every": [1, 5], "steps": [2, 3]}
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3]
    # resumed once complete: it says so, and writes nothing (no resume_log line either)
    capsys.readouterr()
    complete = _hashes(run)
    assert main(["train", *sets, "--set", "steps=3", "--set", "checkpoint.every=5", "--out", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "is complete (its newest checkpoint is step 3 of steps 3); nothing to train" in out and "Wrote" not in out
    assert _hashes(run) == complete
    # the library refuses the same way: Trainer.train(resume=True) with another algorithm
    from seeupo.validation.errors import InputError

    other = Trainer(load_train_config(None, SMALL + ["steps=4", "checkpoint.every=1", "algorithm.preset=rloo", f"out_dir={run}"]))
    with pytest.raises(InputError, match="algorithm.preset: 'seeupo' -> 'rloo'"):
        other.train(resume=True)
    assert (run / "config.yaml").read_text() == config_text and len((run / "resume_log.jsonl").read_text().splitlines()) == 1
    # without --resume an existing run folder is refused
    assert main(["train", *sets, "--out", str(run)]) == 2
    assert "already holds a run; pass --resume" in _one_line(capsys)


def test_resume_needs_a_checkpoint(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert main(["train", "--set", "steps=1", "--out", str(missing), "--resume"]) == 2
    assert f"argument --resume: {missing} does not exist" in _one_line(capsys)
    assert not missing.exists()  # the error comes before the folder is made
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", "--set", "steps=1", "--out", str(empty), "--resume"]) == 2
    assert "holds no checkpoint" in _one_line(capsys) and not any(empty.iterdir())
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--out", str(empty), "--resume", "--resume-if-possible"])
    assert exit_.value.code == 2 and "not allowed with argument --resume" in _one_line(capsys)


def test_a_context_no_prompt_fits_is_one_line_before_the_warm_up(tmp_path, capsys):
    start = time.perf_counter()
    sets = [a for s in SMALL + ["steps=1", "rollout.max_context=10", "env.options.warmup_steps=100000"] for a in ("--set", s)]
    assert main(["train", *sets, "--out", str(tmp_path / "run")]) == 2
    err = _one_line(capsys)
    assert "field 'config.rollout.max_context': 10 tokens: no prompt" in err
    assert time.perf_counter() - start < 20  # 100000 warm-up steps would take far longer: refused before them


def test_no_prompt_fits_at_rollout_is_the_same_one_line_error(tmp_path):
    from seeupo.validation.errors import InputError

    trainer = Trainer(load_train_config(None, SMALL + ["steps=1", f"out_dir={tmp_path}"]))
    trainer.cfg = load_train_config(None, SMALL + ["steps=1", f"out_dir={tmp_path}", "rollout.max_context=5"])
    with pytest.raises(InputError) as err:
        trainer.rollout(1)
    assert err.value.field == "config.rollout.max_context"


def test_every_scoring_layout_trains_alike(tmp_path):
    runs = {}
    for scoring in ("prefix_shared", "packed", "per_row"):
        cfg = load_train_config(None, SMALL + ["algorithm.preset=ppo", "steps=2", "model.dtype=float64", f"optim.scoring={scoring}",
                                               f"out_dir={tmp_path / scoring}"])
        trainer = Trainer(cfg)
        assert trainer.policy.scoring == trainer.reference._policy.scoring == trainer.critic.scoring == scoring
        trainer.train()
        runs[scoring] = _comparable(read_metrics(tmp_path / scoring))
    for layout in ("prefix_shared", "packed"):
        assert runs[layout][0].keys() == runs["per_row"][0].keys() and len(runs[layout]) == 3
        for got, per_row in zip(runs[layout], runs["per_row"]):
            for key, value in per_row.items():
                assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (layout, key)


def test_memory_share_reaches_every_model(tmp_path):
    cfg = load_train_config(None, SMALL + ["algorithm.preset=ppo", "parallel.memory_share=0.6", f"out_dir={tmp_path}"])
    trainer = Trainer(cfg, prepare=False)
    budgets = (trainer.policy._budget, trainer.reference._policy._budget, trainer.critic._budget)
    assert [budget.share for budget in budgets] == [0.6, 0.6, 0.6]


def test_warm_up_runs_the_environments_steps_and_logs_the_first_batch_loglik_before_its_step(tiny32):
    """One step of the bridge's format warm-up: the log-likelihood it reports is the batch's under the
    starting weights (computed again here from the same draws), and the step moves the weights."""
    import copy
    import dataclasses

    import torch

    from seeupo.llm.envs import make_environment
    from seeupo.llm.layout import scoring_batch
    from seeupo.llm.policy import CausalLMPolicy
    from seeupo.llm.trainer import warm_up

    model, tok = tiny32
    spec = make_environment("bridge", {"warmup_steps": 3, "warmup_lr": 1e-2}, tok, seed=7).warm_up
    assert (spec.steps, spec.lr, spec.seed, spec.metric) == (3, 1e-2, 7, "bridge/warmup_loglik")
    start = copy.deepcopy(model)
    contexts, responses = spec.examples(torch.Generator().manual_seed(7))  # the first batch the warm-up draws
    with torch.no_grad():
        expected = float(CausalLMPolicy(start, temperature=0.8).token_logps(scoring_batch(contexts, responses, tok.pad_token_id or 0)).sum(1).mean())
    warmed = copy.deepcopy(model)
    logs = warm_up(CausalLMPolicy(warmed, temperature=0.8), dataclasses.replace(spec, steps=1), tok)
    assert logs == {"bridge/warmup_loglik": pytest.approx(expected, rel=1e-6)}
    assert any(not torch.equal(a, b) for a, b in zip(start.parameters(), warmed.parameters()))
    with pytest.raises(ValueError, match="at least one step"):
        dataclasses.replace(spec, steps=0)


def test_the_trainer_warms_up_the_fresh_model_and_logs_it_at_step_0(tmp_path):
    """The trainer's set-up step is :func:`warm_up` of the environment's spec on the fresh model:
    the same weights and log-likelihood as running it by hand; ``prepare=False`` skips it."""
    import torch

    from seeupo.llm.build import load_model
    from seeupo.llm.policy import CausalLMPolicy
    from seeupo.llm.trainer import warm_up

    cfg = load_train_config(None, SMALL + ["steps=1", f"out_dir={tmp_path}"])
    trainer = Trainer(cfg)
    model, tok = load_model(cfg.model.name, cfg.model.dtype, cfg.model.seed)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    logs = warm_up(CausalLMPolicy(model, temperature=cfg.rollout.temperature), trainer.env.warm_up, tok)
    assert trainer.setup_metrics == logs and set(logs) == {"bridge/warmup_loglik"}
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in trainer.model.state_dict().items())
    trainer.train()
    assert read_metrics(tmp_path)[0]["bridge/warmup_loglik"] == logs["bridge/warmup_loglik"]

    untouched = Trainer(cfg, prepare=False)
    assert untouched.setup_metrics == {}
    assert all(torch.equal(v, fresh[k]) for k, v in untouched.model.state_dict().items())


def test_the_set_up_says_what_it_does_before_the_first_step_and_changes_nothing(tmp_path, capsys):
    """With ``progress`` the set-up (loading, the environment, the warm-up with its bar, the models) is
    said on stderr, in order, before any training step; the warmed-up weights are those of a silent set-up."""
    import torch

    cfg = load_train_config(None, SMALL + ["steps=1", f"out_dir={tmp_path}"])
    said = Trainer(cfg, progress=True)
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("set-up: ")]
    assert [line.split(" ")[1] for line in lines] == ["loading", "environment", "supervised", "building"], err
    assert "warm-up:" in err  # the warm-up's progress bar
    silent = Trainer(cfg)
    assert capsys.readouterr().err == ""
    assert all(torch.equal(v, silent.model.state_dict()[k]) for k, v in said.model.state_dict().items())


def test_a_warm_up_with_a_target_stops_once_it_is_met_and_logs_what_it_reached(tiny32):
    """With ``WarmUp.target`` the warm-up measures before the first step and every ``check_every``
    steps, stops at the first measurement at or above the threshold, and logs it with the steps
    taken; a target it never meets runs to the cap and logs the value there. The bridge's measure
    is the exact probability of a valid first answer, which the warm-up raises."""
    import copy
    import dataclasses

    from seeupo.llm.envs import make_environment
    from seeupo.llm.envs.bridge import BridgeOptions, Spelling, bridge_problem, valid_first_answer_prob
    from seeupo.llm.policy import CausalLMPolicy
    from seeupo.llm.trainer import warm_up

    model, tok = tiny32
    spec = make_environment("bridge", {"warmup_steps": 6, "warmup_lr": 1e-2, "warmup_target": 0.5,
                                       "warmup_check_every": 2}, tok, seed=7).warm_up
    name, measure, threshold = spec.target
    assert (name, threshold, spec.check_every) == ("bridge/warmup_valid_prob", 0.5, 2)

    seen: list[float] = []
    counted = dataclasses.replace(spec, target=(name, lambda p: seen.append(len(seen)) or float(len(seen) >= 3), 1.0))
    logs = warm_up(CausalLMPolicy(copy.deepcopy(model), temperature=0.8), counted, tok)
    assert seen == [0, 1, 2] and logs["bridge/warmup_steps"] == 4 and logs[name] == 1.0  # measured at steps 0, 2, 4

    never = dataclasses.replace(spec, target=(name, measure, 1.1))
    policy = CausalLMPolicy(copy.deepcopy(model), temperature=0.8)
    problem = bridge_problem(BridgeOptions())  # the options above leave the problem at its defaults
    before = valid_first_answer_prob(policy, tok, problem, Spelling.for_problem(problem, tok, BridgeOptions().alphabet))
    logs = warm_up(policy, never, tok)
    assert logs["bridge/warmup_steps"] == 6 and logs[name] > before  # the cap, and the format was being learnt
    assert logs[name] == pytest.approx(measure(policy), abs=1e-12)


@pytest.mark.parametrize("field", ["logprobs", "layer_kernels"])
def test_liger_without_cuda_is_refused_before_the_run_folder_exists(tmp_path, capsys, field):
    """One process trains on the CPU, GPU or not: liger's kernels cannot run there."""
    run = tmp_path / "run"
    assert main(["train", "--set", "steps=1", "--set", f"optim.{field}=liger", "--out", str(run), "--no-progress"]) == 2
    assert _one_line(capsys).startswith(f"seeupo train: error: field 'config.optim.{field}': 'liger' cannot run: ")
    assert not run.exists()


def test_layer_kernels_liger_has_none_of_are_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """Where liger could run (CUDA), a model type it has no layer kernels for is refused from the
    config alone: before the run folder exists and before the model is loaded and warmed up."""
    import seeupo.llm.build as build
    import seeupo.llm.kernels as kernels
    import seeupo.llm.logprobs as logprobs

    monkeypatch.setattr(logprobs, "liger_unavailable", lambda device: None)
    monkeypatch.setattr(kernels, "_liger_apply_functions", lambda: {"llama": None})
    import seeupo.llm.trainer as trainer

    monkeypatch.setattr(trainer, "load_model", lambda *a: pytest.fail("the model was loaded"))
    run = tmp_path / "run"
    assert main(["train", "--set", "steps=1", "--set", "optim.layer_kernels=liger", "--out", str(run), "--no-progress"]) == 2
    assert _one_line(capsys).rstrip() == ("seeupo train: error: field 'config.optim.layer_kernels': 'liger' cannot run: "
                                          "liger-kernel has no layer kernels for model type 'qwen3'")
    assert not run.exists()
    folder = tmp_path / "local-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    assert (build.model_type("tiny-qwen3"), build.model_type(str(folder)), build.model_type(str(tmp_path / "none"))) == (
        "qwen3", "llama", None)


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_model_name_that_is_neither_built_in_nor_a_folder_is_refused_before_the_output_folder(tmp_path, capsys,
                                                                                                 command):
    run = tmp_path / "run"
    assert main([command, "--set", "model.name=" + str(tmp_path / "no-such-model"), "--out", str(run), "--no-progress"]) == 2
    assert _one_line(capsys).startswith(f"seeupo {command}: error: field 'config.model.name': ")
    assert not run.exists()


def test_an_on_policy_step_scores_its_old_logps_in_the_update_pass(tmp_path, monkeypatch):
    """GRPO with one epoch and one minibatch makes no scoring pass of the policy before its update,
    and trains exactly as the rescoring reference does (float64)."""
    import torch

    runs = {}
    for rescore in (False, True):
        if rescore:  # the reference path: every update rescored first
            monkeypatch.setattr("seeupo.llm.trainer.is_on_policy", lambda cfg: False)
        out = tmp_path / f"rescore_{rescore}"
        cfg = load_train_config(None, SMALL + ["algorithm.preset=grpo", "steps=2", "model.dtype=float64", f"out_dir={out}"])
        trainer = Trainer(cfg)
        passes: list[bool] = []
        scored = trainer.policy.token_logps

        def counted(batch, scored=scored, passes=passes):
            passes.append(torch.is_grad_enabled())
            return scored(batch)

        trainer.policy.token_logps = counted
        trainer.train()
        runs[rescore] = _comparable(read_metrics(out)), passes
    (fused, passes), (reference, reference_passes) = runs[False], runs[True]
    assert passes.count(True) == reference_passes.count(True) == 2  # one update pass per step
    assert reference_passes.count(False) - passes.count(False) == 2  # one scoring pass fewer per step
    assert len(fused) == len(reference) == 3
    for got, want in zip(fused, reference):
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="the fused AdamW of CUDA parameters needs a GPU"))])
def test_adamw_is_fused_on_cuda_and_steps_as_the_reference(device):
    import torch

    from seeupo.llm.trainer import adamw

    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 4).to(device)
    model = torch.nn.Linear(8, 4).to(device)
    model.load_state_dict(ref.state_dict())
    start = ref.weight.detach().clone()
    fast, slow = adamw(model.parameters(), lr=1e-2, weight_decay=0.1), torch.optim.AdamW(ref.parameters(), lr=1e-2,
                                                                                          weight_decay=0.1)
    assert bool(fast.defaults["fused"]) == (device == "cuda")
    for _ in range(3):
        x = torch.randn(5, 8, device=device)
        for net, opt in ((model, fast), (ref, slow)):
            opt.zero_grad()
            net(x).square().sum().backward()
            opt.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref.weight, start)  # the steps moved the weights
