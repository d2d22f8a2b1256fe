"""Data parallelism (FSDP2 over gloo, 2 processes on the CPU) makes the single-process update."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seeupo.core.parallel import DataParallel
from seeupo.llm.config import load_train_config
from seeupo.llm.distributed import split_groups
from seeupo.llm.metrics import read_metrics
from seeupo.llm.trainer import Trainer

WORKER = Path(__file__).with_name("distributed_worker.py")
# a tiny float64 model (after 20 warm-up steps, done once: it answers validly, mostly), 4 tasks x 2
# rollouts, 2 turns; micro-batches of 3 rows (uneven across
# processes, so some passes are padded), gradient clipping and the KL reference on
OVERRIDES = ["model.dtype=float64", "rollout.tasks_per_step=4", "algorithm.group_size=2", "env.options.warmup_steps=0",
             "env.options.num_tasks=8", "optim.lr=3e-3", "optim.micro_batch_rows=3", "optim.max_grad_norm=0.05",
             "logging.progress=false", "algorithm.epochs=2", "algorithm.minibatches=2", "logging.m_final=true"]
# per preset, extra overrides. ppo without KL: its first minibatch here has all-zero advantages, so
# that step's gradient is mathematically 0 and, with KL, only rounding noise (1e-18, different in 1
# and 2 processes), which Adam (eps 1e-8) turns into parameter differences of 1e-9 three steps later.
# rloo makes one step per update (on-policy): each process scores its rows' old log-probabilities
# in its own update passes, and they are gathered for the metrics
PRESETS = {"grpo": [], "seeupo": [], "ppo": ["algorithm.kl_coef=0"], "rloo": ["algorithm.epochs=1", "algorithm.minibatches=1"]}


def _torchrun(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _assert_close(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k].to(torch.float64) - b[k].to(torch.float64)).abs().max()) for k in a)
    assert worst < 1e-10, f"{what}: parameters differ by {worst:.3g}"


def warm_model(weights: dict) -> tuple[torch.nn.Module, object]:
    """The tiny model of :data:`OVERRIDES` with the given weights (the warmed-up ones), norms in float64.

    The packed scoring layout adds the gradients of a trajectory's turns before each norm's
    backward pass, which transformers' RMSNorm rounds to float32; 1 and 2 processes cut the rows
    into different micro-batches (3 rows), so they pack differently and, with float32 norms,
    differ by float32 rounding (2e-9 on the parameters). In float64 throughout they agree to 1e-10.
    """
    from seeupo.llm.models import norms_in_model_dtype, tiny_qwen3

    model, tokenizer = tiny_qwen3(seed=0, dtype=torch.float64)
    model.load_state_dict(weights)
    return norms_in_model_dtype(model), tokenizer


@pytest.mark.slow
def test_two_processes_make_the_single_process_update(tmp_path):
    cfg = load_train_config(None, OVERRIDES + ["env.options.warmup_steps=20", f"out_dir={tmp_path / 'rollout'}"])
    rollout = Trainer(cfg)
    weights = {k: v.detach().clone() for k, v in rollout.model.state_dict().items()}
    batches = [rollout.rollout(2).batch, rollout.rollout(1).batch]
    # two turns, an episode that ended after one (a placeholder row), and rewards to learn from
    assert len({int(t) for t in batches[0].turn}) == 2 and batches[0].num_groups == 4
    assert not bool(batches[0].valid.all()) and float(batches[0].traj_return.abs().sum()) > 0
    torch.save({"overrides": OVERRIDES, "presets": PRESETS, "batches": batches, "weights": weights}, tmp_path / "data.pt")
    single = {}
    for preset, extra in PRESETS.items():
        out = tmp_path / preset / "single"
        model, tokenizer = warm_model(weights)
        trainer = Trainer(load_train_config(None, OVERRIDES + extra + [f"algorithm.preset={preset}", f"out_dir={out}"]),
                          model=model, tokenizer=tokenizer)
        metrics = trainer.update(batches[0])
        params = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        trainer.save()
        trainer.update(batches[1])
        single[preset] = (params, metrics, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()})

    run = _torchrun(str(WORKER), str(tmp_path))
    assert run.returncode == 0, run.stderr[-4000:]

    for preset, extra in PRESETS.items():
        params, metrics, second = single[preset]
        dp = torch.load(tmp_path / preset / "dp_result.pt", weights_only=False)
        _assert_close(dp["params"], params, f"{preset}: first update")
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/pg_clipfrac", "critic/score/mean", "actor/optimizer_steps",
                    "rollout/logp_diff_max"):
            assert dp["metrics"][key] == pytest.approx(metrics[key], rel=1e-9, abs=1e-12), key
        if preset == "seeupo":
            assert dp["metrics"]["seeupo/m_final_max"] == pytest.approx(metrics["seeupo/m_final_max"], rel=1e-9)
        if preset == "ppo":
            assert dp["metrics"]["critic/vf_loss"] == pytest.approx(metrics["critic/vf_loss"], rel=1e-9)
        # 2 processes resumed from the 1-process checkpoint, and 1 process from the 2-process one
        _assert_close(dp["second"], second, f"{preset}: second update, resumed by 2 processes")
        model, tokenizer = warm_model(weights)
        resumed = Trainer(load_train_config(None, OVERRIDES + extra + [f"algorithm.preset={preset}", f"out_dir={tmp_path / preset / 'dp'}"]),
                          model=model, tokenizer=tokenizer)
        assert resumed.resume() == 1
        _assert_close(resumed.model.state_dict(), params, f"{preset}: 2-process checkpoint loaded by 1 process")
        resumed.update(batches[1])
        _assert_close(resumed.model.state_dict(), second, f"{preset}: second update, resumed by 1 process")
        # the update moved the parameters (the comparison is not of two untouched models)
        assert any(float((second[k] - params[k]).abs().max()) > 1e-6 for k in params)


def test_split_groups_gives_each_process_whole_groups_renumbered_from_zero():
    # (gather_batch, its inverse, needs processes: the 2-process test above runs it)
    cfg = load_train_config(None, OVERRIDES + ["out_dir=unused"])
    batch = Trainer(cfg).rollout(1).batch
    parts = [split_groups(batch, 2, r) for r in range(2)]
    assert [p.num_groups for p in parts] == [2, 2] and all(int(p.traj_id.min()) == 0 for p in parts)
    assert sum(p.num_rows for p in parts) == batch.num_rows
    # the rows keep their order: process 0's rows then process 1's are the batch's rows
    torch.testing.assert_close(torch.cat([p.logp_old for p in parts]), batch.logp_old, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([p.traj_id + r * parts[0].num_trajectories for r, p in enumerate(parts)]),
                               batch.traj_id, rtol=0, atol=0)
    with pytest.raises(ValueError, match="cannot be split"):
        split_groups(batch, 3, 0)


@pytest.mark.slow
def test_torchrun_train_then_resume_on_one_process(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("steps: 3\ncheckpoint: {every: 2, keep: 2}\n")
    # bf16 mixed precision over float32 weights and activation checkpointing, as on GPUs
    sets = [a for s in OVERRIDES[1:] + ["steps=2", "parallel.mixed_precision=bf16", "parallel.activation_checkpointing=true"]
            for a in ("--set", s)]
    run = _torchrun("-m", "seeupo", "train", str(config), "--out", str(tmp_path / "run"), "--no-progress", *sets)
    assert run.returncode == 0, run.stderr[-4000:]
    # the tree rule reaches attention through FSDP2's bf16 input casting (it rides on a boolean tensor)
    assert "falls back to 'packed'" not in run.stderr
    assert run.stdout.count("step 2") == 1  # process 0 prints, the other does not
    meta = (tmp_path / "run" / "checkpoints" / "step_00000002" / "meta.json").read_text()
    assert '"processes": 2' in meta
    sets = [a for s in OVERRIDES[1:] for a in ("--set", s)]
    resumed = subprocess.run([sys.executable, "-m", "seeupo", "train", str(config), "--out", str(tmp_path / "run"),
                              "--no-progress", "--resume", *sets], capture_output=True, text=True, timeout=900,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [0, 1, 2, 3]


def test_tasks_per_step_must_divide_among_processes():
    from seeupo.llm.distributed import Distributed
    from seeupo.validation.errors import InputError

    cfg = load_train_config(None, OVERRIDES + ["rollout.tasks_per_step=3", "out_dir=unused"])
    fake = Distributed(DataParallel(0, 2), 0, torch.device("cpu"), None)
    with pytest.raises(InputError, match="3 tasks cannot be shared by 2 processes"):
        Trainer(cfg, dist=fake)


def test_activation_checkpointing_recomputes_layers_and_keeps_the_gradient(tiny64):
    import copy

    from seeupo.llm.distributed import decoder_layers, enable_activation_checkpointing
    from seeupo.llm.policy import CausalLMPolicy
    from seeupo.llm.layout import scoring_batch

    model, tokenizer = tiny64
    plain, checkpointed = copy.deepcopy(model), copy.deepcopy(model)
    enable_activation_checkpointing(checkpointed)
    batch = scoring_batch([[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15]], tokenizer.pad_token_id)
    grads, calls = [], []
    for m in (plain, checkpointed):
        count = [0]
        policy = CausalLMPolicy(m, scoring="packed")  # before the hook: it probes tree attention once
        # the layer's own hooks stay outside the checkpoint: count a module inside it
        decoder_layers(m)[0].mlp.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
        policy.token_logps(batch).sum().backward()
        grads.append({k: p.grad.clone() for k, p in m.named_parameters()})
        calls.append(count[0])
    assert calls == [1, 2]  # the checkpointed layer runs again in the backward pass
    assert max(float((grads[0][k] - grads[1][k]).abs().max()) for k in grads[0]) < 1e-12
    assert not checkpointed.model.layers[0].self_attn.training  # dropout stays off inside the layer


def test_exit_skipping_teardown_flushes_and_exits_with_the_status():
    script = ("import atexit, sys\n"
              "from seeupo.llm.distributed import exit_skipping_teardown\n"
              "atexit.register(lambda: print('teardown ran'))\n"
              "sys.stdout.write('written before the exit')\n"
              "exit_skipping_teardown(3)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert run.returncode == 3, run.stderr
    assert run.stdout == "written before the exit"  # flushed, and no atexit handler ran


@pytest.mark.parametrize("joined", [False, True])
def test_the_command_line_skips_teardown_only_where_a_process_group_was_joined(monkeypatch, joined):
    import seeupo.cli as cli
    import seeupo.llm.distributed as distributed

    class Skipped(Exception):
        pass

    def skipped(status):
        raise Skipped(status)

    monkeypatch.setattr(cli, "main", lambda: 5)
    monkeypatch.setattr(cli.signal, "signal", lambda *args: None)  # console's SIGPIPE setting stays out of pytest
    monkeypatch.setattr(distributed, "_joined", joined)
    monkeypatch.setattr(distributed, "exit_skipping_teardown", skipped)
    with pytest.raises(Skipped if joined else SystemExit) as ended:
        cli.console()
    status = ended.value.args[0] if joined else ended.value.code
    assert status == 5
