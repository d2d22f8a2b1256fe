"""Issue 9 §4: the LLM path makes the tabular engine's update, exactly.

A :class:`~seeupo.llm.table_model.TableLM` (a "model" whose logits are a tabular policy's table,
read from the history in the bridge's chat ids) is trained for one step by the real
:class:`~seeupo.llm.trainer.Trainer` (agent loop, bridge environment, ``CausalLMPolicy``, reference
model, critic, ``policy_update``, AdamW, gradient clipping) with :class:`TableEngine` sampling. The
very rollout it trained on (the bridge environments' actions and observations, recorded by a thin
wrapper around ``EnvSpec.make``) is then rebuilt as a tabular batch by the tabular engine's own
batch builder, which derives histories, rewards, termination, placeholders, ids and ``logp_old``
from the tabular problem and policy, and updated with the same core call on a
:class:`~seeupo.tabular.policies.TabularPolicy` started from the same logits. Parameters,
the per-step statistics (objective, gradient norm, KL, clip fraction, ``M``) and the exact ``J``
must agree to 1e-10 in float64.

PPO: the trainer's critic is a :class:`~seeupo.llm.policy.ValueModel` on the TableLM's one-hot
backbone, so its head weights are a value per state; they are set to the exact values of the
sampling policy, computed here from :func:`seeupo.tabular.exact.evaluate`, while the tabular side
uses its own exact critic :func:`seeupo.tabular.rollout.critic_values`. Both layers then see the
same critic values if, and only if, the LM critic reads the value of the state before each token
at the right position.

KL: on (the paper's k3 coefficient, larger in the multi-step test), against a frozen copy of the
initial policy on both sides. Temperature: the paper's 0.9; the TableLM outputs ``0.9 * table``,
so its sampling distribution is the tabular policy's.

Problems: a 2-turn tree MDP with 2-token actions (binary alphabet), stochastic observations and
early termination (placeholder rows), and a 2-turn sequential bandit with one-token actions of 3
then 2 symbols (the third symbol is masked at the second turn).

Minibatches of 2 trajectories on the tree MDP (some turn's rows all placeholders) are compared
too: they found a crash of the LLM path in the sequential schedule and an AdamW-state difference
(a zero gradient versus none), both fixed.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

pytest.importorskip("transformers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")
pytest.importorskip("tokenizers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")

import torch  # noqa: E402

from seeupo.core.update import UpdateSettings, compute_advantages, final_factor, policy_update  # noqa: E402
from seeupo.llm.config import load_train_config  # noqa: E402
from seeupo.llm.agent import ChatDelta  # noqa: E402
from seeupo.llm.envs.bridge import Spelling, _original_index, exact_action_probs, exact_J, history_context  # noqa: E402
from seeupo.llm.models import train_bpe_tokenizer  # noqa: E402
from seeupo.llm.policy import CausalLMPolicy  # noqa: E402
from seeupo.llm.rollout import SamplingParams  # noqa: E402
from seeupo.llm.table_model import TableEngine, TableLM  # noqa: E402
from seeupo.llm.trainer import Trainer, _step_seed  # noqa: E402
from seeupo.tabular.exact import evaluate  # noqa: E402
from seeupo.tabular.instances import load_problem, problem_to_dict  # noqa: E402
from seeupo.tabular.policies import TabularPolicy  # noqa: E402
from seeupo.tabular.problems import DTYPE, random_sequential_bandit, random_tree_mdp  # noqa: E402
from seeupo.tabular.rollout import _build_batch, critic_values  # noqa: E402

PRESETS = ["ppo", "grpo", "gspo", "rloo", "reinforce_pp", "seeupo"]
TAU = 0.9
TOL = 1e-10
"""Parameters agree to rounding (~1e-16) except where a gradient is mathematically zero (an action never
sampled at a history whose group advantages sum to 0): Adam's first step divides the rounding noise
(~1e-18) by ``|g| + eps`` (eps = 1e-8), so the two layers' noise becomes ``lr * 1e-10`` apart."""


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(512)


def tree_problem():
    """2 turns, 4 actions spelled as 2 binary tokens, 2 observations, early termination, 2 initial states."""
    p = random_tree_mdp(1, (4, 4), (2, 2), num_initial_states=2, reward_levels=5, generator=torch.Generator().manual_seed(1))
    # turn-1 ends drawn here in float64 (random_tree_mdp draws them in torch's default dtype, which the
    # test suite's conftest sets to float64, so the same seed gives other ends in and out of pytest)
    ends = torch.rand(p.terminal[0].shape, generator=torch.Generator().manual_seed(4), dtype=DTYPE) < 0.4
    return dataclasses.replace(p, terminal=[ends, p.terminal[1]], tokens=((2, 2), (2, 2))), ("a", "b")


def bandit_problem():
    """The paper's sequential bandit: 3 then 2 one-token actions (the 3rd symbol is never valid at turn 2)."""
    p = random_sequential_bandit(1, (3, 2), num_initial_states=2, generator=torch.Generator().manual_seed(7))
    return p, ("a", "b", "c")


PROBLEMS = {"tree": tree_problem, "bandit": bandit_problem}


class RecordingEnv:
    """A bridge environment that keeps its task and each turn's ``info`` (action, observation)."""

    def __init__(self, env):
        self.env, self.task, self.infos = env, None, []

    def reset(self, task):
        self.task, self.infos = task, []
        return self.env.reset(task)

    def step(self, text, ids):
        result = self.env.step(text, ids)
        self.infos.append(dict(result.info))
        return result


def make_trainer(tmp_path, tokenizer, problem_name, preset, extra=()):
    problem, alphabet = PROBLEMS[problem_name]()
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(problem_to_dict(problem)))
    problem = load_problem(path).instance(0)  # exactly the problem the bridge loads
    overrides = [
        f"algorithm.preset={preset}", "algorithm.group_size=4", "rollout.tasks_per_step=3", f"rollout.temperature={TAU}",
        "model.dtype=float64", f"env.options.instance={path}", f"env.options.alphabet=[{', '.join(alphabet)}]",
        "env.options.num_tasks=3", "env.options.warmup_steps=0", "optim.lr=0.05", "optim.max_grad_norm=0.1",
        "logging.progress=false", "logging.m_final=true", "steps=1", f"out_dir={tmp_path}", *extra,
    ]
    if preset == "ppo":  # lambda < 1: GAE reads the critic at every token
        overrides.append("algorithm.gae_lambda=0.9")
    cfg = load_train_config(None, overrides)
    spelling = Spelling.for_problem(problem, tokenizer, alphabet)
    policy = TabularPolicy(problem, init_scale=1.0, generator=torch.Generator().manual_seed(3))
    model = TableLM.from_policy(policy, tokenizer, problem, spelling, temperature=TAU)
    trainer = Trainer(cfg, model=model, tokenizer=tokenizer, engine=TableEngine(model))
    records = []

    def make(generator, _make=trainer.env.make):
        env = RecordingEnv(_make(generator))
        records.append(env)
        return env

    trainer.env = dataclasses.replace(trainer.env, make=make)
    if trainer.critic is not None:
        set_exact_critic(trainer.critic, model, problem, policy)
    return trainer, model, policy, problem, spelling, records


@torch.no_grad()
def set_exact_critic(critic, model, problem, policy):
    """Head weight of state ``(t, h, j, prefix)`` = ``E[Q_t(h, a) | first j tokens of a]`` under ``policy``."""
    probs = policy.action_probs()
    q = evaluate(problem, probs).Q
    weight = torch.zeros(len(model.states) + 1, dtype=DTYPE)
    for s, (t, h, j, prefix) in enumerate(model.states):
        vocab, length = problem.tokens[t]
        below = vocab ** (length - j)  # actions sharing the first j tokens are a contiguous block
        block = slice(prefix * below, (prefix + 1) * below)
        p = probs[t][0, h, block]
        weight[s] = (p * q[t][0, h, block]).sum() / p.sum()
    critic.head.weight.copy_(weight[None, :])
    critic.head.bias.zero_()


def tabular_batch(problem, policy, records, group_size):
    """The recorded rollout as the tabular engine's batch (histories, rewards, ends from the problem)."""
    n_traj, T = len(records), problem.num_turns
    hist = torch.zeros(n_traj, T, dtype=torch.long)
    action = torch.zeros_like(hist)
    alive = torch.zeros(n_traj, T, dtype=torch.bool)
    reward = torch.zeros(n_traj, T, dtype=DTYPE)
    for k, env in enumerate(records):
        assert env.task == records[k - k % group_size].task  # a group shares its task
        h = int(env.task)
        for t, info in enumerate(env.infos):
            assert not info["invalid"] and info["turn"] == t
            a, o = info["action"], info["observation"]
            hist[k, t], action[k, t], alive[k, t] = h, a, True
            reward[k, t] = problem.rewards[t][0, h, a, o]
            ends = bool(problem.terminal[t][0, h, a, o])
            assert ends == (t == len(env.infos) - 1)
            h = (h * problem.actions_per_turn[t] + a) * problem.obs_per_turn[t] + o
    group = torch.arange(n_traj) // group_size
    zeros = torch.zeros(n_traj, dtype=torch.long)
    return _build_batch(problem, policy, hist, action, alive, reward, torch.ones(n_traj, dtype=DTYPE), group, zeros)


def tabular_step(trainer, problem, policy, records):
    """What :meth:`Trainer.step` does after the rollout, on the tabular policy; returns the update's stats."""
    cfg, algo = trainer.cfg, trainer.cfg.algorithm
    reference = copy.deepcopy(policy)
    batch = tabular_batch(problem, policy, records, algo.group_size)
    assert int(batch.valid.view(-1, problem.num_turns).sum(1).max()) == problem.num_turns  # T rows, as the LLM batch
    values = critic_values(problem, policy, batch) if algo.advantage == "gae" else None
    advantages = compute_advantages(batch, algo, critic_values=values)
    o = cfg.optim
    optimizer = torch.optim.AdamW(policy.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
    with torch.no_grad():
        logp_ref = reference.token_logps(batch) if algo.kl_coef > 0 else None
    return batch, policy_update(policy, optimizer, batch, advantages, algo, UpdateSettings(
        logp_ref=logp_ref, generator=torch.Generator().manual_seed(_step_seed(cfg.seed, 1, 4)),
        micro_batch_rows=o.micro_batch_rows, max_grad_norm=o.max_grad_norm,
    ))


def mean(xs):
    return sum(xs) / len(xs)


def check_probs_and_J(model, policy, problem, spelling, tokenizer, tol=1e-12):
    """The TableLM's exact action probabilities are the tabular policy's; the bridge's J is the tabular J.

    ``tol``: 1e-12 for equal parameters; after an update, the parameters' own tolerance.
    """
    lm_probs = exact_action_probs(CausalLMPolicy(model, temperature=TAU), tokenizer, problem, spelling)
    with torch.no_grad():
        tab_probs = policy.action_probs()
    for t, (lm_p, tab_p) in enumerate(zip(lm_probs, tab_probs)):
        original = _original_index(problem, t)
        keep = original >= 0
        assert (lm_p[0, keep, :-1] - tab_p[0, original[keep]]).abs().max() <= tol
        assert lm_p[0, keep, -1].max() <= 1e-15  # the invalid action
    j_lm, _ = exact_J(CausalLMPolicy(model, temperature=TAU), tokenizer, problem, spelling)
    assert abs(j_lm - float(evaluate(problem, tab_probs).J[0])) <= tol
    return j_lm


def run_and_compare(tmp_path, tokenizer, problem_name, preset, extra=()):
    trainer, model, policy, problem, spelling, records = make_trainer(tmp_path, tokenizer, problem_name, preset, extra)
    check_probs_and_J(model, policy, problem, spelling, tokenizer)
    before = [p.detach().clone() for p in policy.logits]
    metrics = trainer.step()
    batch, stats = tabular_step(trainer, problem, policy, records)
    m_final = final_factor(policy, batch, trainer.cfg.algorithm, stats)  # as the trainer logs it (logging.m_final)
    if problem_name == "tree":  # some episodes end early: placeholders
        assert 0 < sum(len(r.infos) < problem.num_turns for r in records) < len(records)

    change = max(float((p.detach() - b).abs().max()) for p, b in zip(policy.logits, before))
    assert change > 1e-3  # the update did something
    diff = max(float((m.detach() - p.detach()).abs().max()) for m, p in zip(model.tables, policy.logits))
    assert diff <= TOL, f"{preset} on {problem_name}: parameters differ by {diff:.3g} (change {change:.3g})"
    assert metrics["actor/optimizer_steps"] == stats.steps and stats.skipped_steps == 0
    assert abs(metrics["actor/pg_loss"] + mean(stats.objective)) <= TOL
    assert abs(metrics["actor/grad_norm"] - mean(stats.grad_norm)) <= TOL * max(1.0, mean(stats.grad_norm))
    assert abs(metrics["actor/kl_loss"] - mean(stats.kl)) <= TOL
    assert abs(metrics["actor/pg_clipfrac"] - mean(stats.clip_frac)) <= TOL
    assert (m_final is None) == ("seeupo/m_final_mean" not in metrics)
    if m_final is not None:
        assert abs(metrics["seeupo/m_final_mean"] - float(m_final.mean())) <= TOL
        assert abs(metrics["seeupo/m_final_max"] - float(m_final.max())) <= TOL
    assert metrics["rollout/logp_diff_max"] <= 1e-12  # the engine's log-probabilities are the policy's
    j = check_probs_and_J(model, policy, problem, spelling, tokenizer, TOL)  # after the update too
    assert abs(metrics["bridge/J"] - j) <= 1e-12
    return diff, change


@pytest.mark.parametrize("problem_name", ["tree", "bandit"])
@pytest.mark.parametrize("preset", PRESETS)
def test_one_trainer_step_is_the_tabular_update(preset, problem_name, tokenizer, tmp_path):
    run_and_compare(tmp_path, tokenizer, problem_name, preset)


MULTI_STEP = ["algorithm.epochs=2", "algorithm.minibatches=2", "algorithm.kl_coef=0.1", "optim.lr=0.15"]


@pytest.mark.parametrize("problem_name", ["tree", "bandit"])
@pytest.mark.parametrize("preset", PRESETS)
def test_several_optimizer_steps_with_kl_match(preset, problem_name, tokenizer, tmp_path):
    # 2 epochs x 2 minibatches: Adam's later steps depend on the gradients' size, the ratios are
    # clipped, and the KL term acts once the policy has moved
    run_and_compare(tmp_path, tokenizer, problem_name, preset, MULTI_STEP)


# Minibatches of 2 trajectories on the tree MDP: some minibatch holds only trajectories that ended
# at turn 1, so its turn-2 rows are all placeholders.
SMALL_MINIBATCHES = ["algorithm.epochs=2", "algorithm.minibatches=6", "algorithm.kl_coef=0.1", "optim.lr=0.15"]


@pytest.mark.parametrize("preset", ["grpo", "seeupo"])
def test_placeholder_only_minibatches_match(preset, tokenizer, tmp_path):
    # a minibatch whose rows of a turn are all placeholders: no gradient reaches that turn's table
    # on either side (None, not zero, so AdamW's momentum leaves it alone), and the LLM path's
    # graph-less micro-batch is skipped rather than crashing the sequential schedule
    run_and_compare(tmp_path, tokenizer, "tree", preset, SMALL_MINIBATCHES)


def test_table_lm_reads_padded_rows_and_checks_positions(tokenizer, tmp_path):
    _, model, policy, problem, spelling, _ = make_trainer(tmp_path, tokenizer, "tree", "grpo")
    ctx = history_context(ChatDelta(tokenizer), problem, spelling, 1, [2], [1]) + [spelling.token_ids[1]]
    x = torch.tensor([ctx])
    plain = model(input_ids=x).logits
    left = torch.tensor([[0, 0] + ctx])
    mask = torch.tensor([[0, 0] + [1] * len(ctx)])
    padded = model(input_ids=left, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0)).logits
    assert torch.equal(padded[:, 2:], plain)
    # the last position: turn 2 (t=1), history (1*4+2)*2+1 = 13, after the first token "b"
    h = (1 * 4 + 2) * 2 + 1
    expected = torch.log_softmax(policy.logits[3][0, h, 1].detach(), -1)
    got = torch.log_softmax(plain[0, -1] / TAU, -1)[list(spelling.token_ids)]
    assert (got - expected).abs().max() <= 1e-15
    assert torch.equal(model(input_ids=x, logits_to_keep=1).logits, plain[:, -1:])
    with pytest.raises(ValueError, match="position ids"):
        model(input_ids=x, attention_mask=torch.ones_like(x), position_ids=torch.arange(len(ctx))[None] + 1)


def test_table_engine_samples_the_current_parameters(tokenizer, tmp_path):
    _, model, policy, problem, spelling, _ = make_trainer(tmp_path, tokenizer, "bandit", "grpo")
    prompt = ChatDelta(tokenizer).prompt_ids([{"role": "system", "content": "x"}])
    engine = TableEngine(model)
    params = SamplingParams(temperature=TAU, max_new_tokens=2, stop_token_ids=(tokenizer.eos_token_id,), seed=5)
    first = engine.generate([prompt], 3, params)
    assert first == engine.generate([prompt], 3, params)  # seeded
    assert all(len(c.token_ids) == 2 and c.finish_reason == "length" for c in first[0])  # not a state: uniform
    with torch.no_grad():  # an in-place change is sampled at once (sync_weights has nothing to do)
        model.tables[0][0, 0, 0, 2] = 100.0
    ctx = history_context(ChatDelta(tokenizer), problem, spelling, 0, [], [])
    out = engine.generate([ctx], 4, SamplingParams(temperature=TAU, max_new_tokens=1, seed=0))[0]
    assert [c.token_ids for c in out] == [[spelling.token_ids[2]]] * 4
