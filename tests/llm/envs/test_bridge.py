"""The bridge's exact ``J`` is the expected return of what is trained on.

Fast: on a discounted instance (``gamma < 1``), every answer sequence is forced through the real
agent loop (a scripted engine), and the probability-weighted sum of the returns the loop puts in
the training batch equals the reported ``bridge/J`` to rounding; the problem's ``gamma`` is the
one discount; cut-off games are refused; :func:`bridge_num_turns` needs no model.

Slow (Monte Carlo, ``make test-slow``): the real trainer's rollouts (Hugging Face ``generate`` on a
tiny random Qwen3 after the bridge's format warm-up) against the exact ``J``, in the default
setting, at ``gamma < 1``, at ``top_p < 1`` and with ``max_turns`` below the game's turns.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest

pytest.importorskip("transformers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")
pytest.importorskip("tokenizers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")

import torch  # noqa: E402

from seeupo.core.batch import per_trajectory  # noqa: E402
from seeupo.llm.agent import AgentLimits, ChatDelta, run_episodes  # noqa: E402
from seeupo.llm.config import load_train_config  # noqa: E402
from seeupo.llm.envs import make_environment  # noqa: E402
from seeupo.llm.envs.bridge import (  # noqa: E402
    BridgeEnv, BridgeOptions, Spelling, bridge_gamma, bridge_num_turns, bridge_problem, exact_action_probs, format_examples,
    history_context, with_invalid_action,
)
from seeupo.llm.policy import CausalLMPolicy  # noqa: E402
from seeupo.llm.rollout import Completion, SamplingParams  # noqa: E402
from seeupo.llm.trainer import warm_up  # noqa: E402
from seeupo.tabular.exact import evaluate  # noqa: E402
from seeupo.tabular.instances import problem_to_dict  # noqa: E402
from seeupo.tabular.problems import DTYPE, random_tree_mdp  # noqa: E402
from seeupo.validation.errors import InputError  # noqa: E402

TAU = 0.9
GAMMA = 0.6
TOP_P = 0.6


class ForcedEngine:
    """Answers call ``t`` (turn ``t``) with ``script[t]``: the token ids of one answer, for every prompt."""

    def __init__(self, script: list[list[int]], eos: int):
        self.script, self.eos, self.calls = script, eos, 0

    def generate(self, prompts, n, params):
        ids = self.script[self.calls]
        self.calls += 1
        reason = "stop" if ids and ids[-1] == self.eos else "length"
        return [[Completion(list(ids), [0.0] * len(ids), reason) for _ in range(n)] for _ in prompts]

    def sync_weights(self, model):
        pass


def discounted_instance(tmp_path, gamma: float = GAMMA):
    """3 turns, 3 actions (2 binary tokens each, so some 2-token answers are invalid), one observation,
    early termination, 2 initial states, rewards at every turn; written as an instance file."""
    p = random_tree_mdp(1, (3, 3, 3), (1, 1, 1), num_initial_states=2, terminate_prob=0.3, reward_levels=5,
                        generator=torch.Generator().manual_seed(11))
    p = dataclasses.replace(p, gamma=gamma)
    path = tmp_path / "discounted.json"
    path.write_text(json.dumps(problem_to_dict(p)))
    return path


@pytest.mark.slow
def test_trained_on_return_has_the_reported_J_as_expectation(tiny64, tmp_path):
    """Sum over every answer sequence of (its probability under the LM) x (the return the agent loop
    puts in the batch) equals ``bridge/J``: the return trained on is discounted as ``J`` is."""
    model, tok = tiny64
    path = discounted_instance(tmp_path)
    options = {"instance": str(path), "warmup_steps": 30, "num_tasks": 2}
    spec = make_environment("bridge", options, tok, seed=0)
    problem = bridge_problem(BridgeOptions(instance=str(path)))
    spelling = Spelling.for_problem(problem, tok, ("a", "b"))
    assert spelling.length == 2 and problem.gamma == GAMMA
    policy = CausalLMPolicy(copy.deepcopy(model), temperature=TAU)
    warm_up(policy, spec.warm_up, tok)  # the format warm-up: valid answers get most of the mass, so J is far from 0
    reported = spec.metrics(policy)["bridge/J"]
    assert reported > 0.1
    probs = exact_action_probs(policy, tok, problem, spelling)  # [1, N_aug_t, A_t + 1]; column A_t: invalid
    invalid_answer = [tok.eos_token_id]  # any answer that is not an action: here, stopping at once
    params = SamplingParams(max_new_tokens=spelling.length, stop_token_ids=(tok.eos_token_id,))
    limits = AgentLimits(max_turns=problem.num_turns)

    def loop_return(s0: int, answers: list[list[int]]) -> tuple[float, list[float]]:
        out = run_episodes(ForcedEngine(answers, tok.eos_token_id), tok, lambda: spec.make(torch.Generator()),
                           [s0], 1, params, limits, dtype=torch.float64)
        assert out.episodes[0].outcome == "done"
        return float(out.batch.traj_return[0]), [t.reward for t in out.turns]

    expectation, undiscounted, leaves = 0.0, 0.0, 0

    def walk(s0: int, t: int, h: int, h_aug: int, prob: float, answers: list[list[int]]) -> None:
        nonlocal expectation, undiscounted, leaves
        a_t = problem.actions_per_turn[t]
        for a in range(a_t + 1):
            p = prob * float(probs[t][0, h_aug, a])
            path = answers + [invalid_answer if a == a_t else spelling.action_ids(a)]
            ends = a == a_t or bool(problem.terminal[t][0, h, a, 0])
            if ends:
                g, rewards = loop_return(s0, path)
                # the loop's return is the discounted sum of the rewards it recorded, gamma the problem's
                assert g == pytest.approx(sum(GAMMA**k * r for k, r in enumerate(rewards)), abs=1e-12)
                expectation += p * g
                undiscounted += p * sum(rewards)
                leaves += 1
            else:
                walk(s0, t + 1, h * a_t + a, h_aug * (a_t + 1) + a, p, path)

    for s0 in range(problem.num_initial_states):
        walk(s0, 0, s0, s0, float(problem.initial_state_probs[0, s0]), [])
    assert leaves > 20  # early ends, invalid answers and full games were all enumerated
    assert expectation == pytest.approx(reported, abs=1e-10)
    # the check has power: the undiscounted return (what the loop trained on before) has another mean
    assert abs(undiscounted - reported) > 0.05


def test_format_warm_up_examples_are_valid_answers_in_the_agent_loops_contexts(tiny32, tmp_path):
    """The bridge's warm-up spec: its examples are answers to real game contexts, each a valid action
    (3 actions spelled with 2 binary symbols: the 4th spelling is invalid and never a target), drawn
    reproducibly from the generator; no spec without warm-up steps."""
    _, tok = tiny32
    path = discounted_instance(tmp_path)
    spec = make_environment("bridge", {"instance": str(path), "warmup_steps": 4, "warmup_lr": 0.5}, tok, seed=3)
    assert (spec.warm_up.steps, spec.warm_up.lr, spec.warm_up.seed) == (4, 0.5, 3)
    problem = bridge_problem(BridgeOptions(instance=str(path)))
    spelling = Spelling.for_problem(problem, tok, ("a", "b"))
    chat = ChatDelta(tok)
    contexts, responses = spec.warm_up.examples(torch.Generator().manual_seed(0))
    assert len(contexts) == len(responses) == 16
    assert all(spelling.parse(r, 3) is not None for r in responses)
    openings = {tuple(chat.prompt_ids(BridgeEnv(problem, spelling).reset(s0))) for s0 in (0, 1)}
    assert all(any(tuple(c[:len(o)]) == o for o in openings) for c in contexts)
    assert any(len(c) > max(len(o) for o in openings) for c in contexts)  # some are later turns' contexts
    again = format_examples(chat, problem, spelling, torch.Generator().manual_seed(0))
    assert again == (contexts, responses)
    assert make_environment("bridge", {"instance": str(path), "warmup_steps": 0}, tok, seed=3).warm_up is None


def test_the_problem_gamma_is_the_only_discount(tiny32, tmp_path):
    _, tok = tiny32
    spec = make_environment("bridge", {"instance": str(discounted_instance(tmp_path)), "warmup_steps": 0}, tok, seed=0)
    env = spec.make(torch.Generator())
    assert isinstance(env, BridgeEnv) and env.gamma == GAMMA
    params = SamplingParams(max_new_tokens=2, stop_token_ids=(tok.eos_token_id,))
    engine = ForcedEngine([[tok.eos_token_id]], tok.eos_token_id)
    with pytest.raises(ValueError, match="contradicts"):  # a caller cannot train on another discount
        run_episodes(engine, tok, lambda: spec.make(torch.Generator()), [0], 1, params, AgentLimits(max_turns=3), gamma=1.0)
    # the random-problem option sets the same attribute, and an instance file keeps its own
    opts = {"turns": 2, "gamma": 0.25, "warmup_steps": 0}
    assert make_environment("bridge", opts, tok, seed=0).make(torch.Generator()).gamma == 0.25
    assert make_environment("bridge", {"warmup_steps": 0}, tok, seed=0).make(torch.Generator()).gamma == 1.0
    with pytest.raises(InputError, match="config.env.options"):
        make_environment("bridge", {"instance": str(tmp_path / "discounted.json"), "gamma": 0.5}, tok, seed=0)
    with pytest.raises(InputError, match="config.env.options.gamma"):
        make_environment("bridge", {"gamma": 1.5}, tok, seed=0)


def test_bridge_num_turns_and_gamma_without_a_model(tmp_path):
    assert bridge_num_turns({}) == BridgeOptions().turns == 2
    assert bridge_num_turns({"turns": 5, "kind": "tree_mdp"}) == 5
    assert bridge_num_turns({"instance": str(discounted_instance(tmp_path))}) == 3
    assert bridge_gamma({}) == 1.0 and bridge_gamma({"gamma": 0.25}) == 0.25
    assert bridge_gamma({"instance": str(discounted_instance(tmp_path))}) == GAMMA
    assert bridge_problem(BridgeOptions(gamma=0.25)).gamma == 0.25
    with pytest.raises(InputError, match="config.env.options.turns"):
        bridge_num_turns({"turns": 0})
    with pytest.raises(InputError, match="config.env.options.nope"):
        bridge_num_turns({"nope": 1})
    with pytest.raises(InputError):
        bridge_num_turns({"instance": str(tmp_path / "missing.json")})


def test_an_answer_cut_by_the_context_is_refused(tiny32):
    """With 2-token answers and room for 1, the loop cuts the answer; a 1-symbol prefix could have become
    a valid action, so scoring it invalid would not be the exact ``J``'s game: refused. A cut prefix that
    is already no symbol is invalid whatever follows, and is scored so."""
    _, tok = tiny32
    spec = make_environment("bridge", {"actions": 4, "warmup_steps": 0}, tok, seed=0)
    spelling = Spelling.for_problem(bridge_problem(BridgeOptions(actions=4)), tok, ("a", "b"))
    assert spelling.length == 2
    params = SamplingParams(max_new_tokens=2, stop_token_ids=(tok.eos_token_id,))
    first = ChatDelta(tok).prompt_ids(spec.make(torch.Generator()).reset(0))
    limits = AgentLimits(max_context=len(first) + 1)
    with pytest.raises(InputError, match="config.rollout.max_context.*cut to 1 of 2"):
        run_episodes(ForcedEngine([spelling.action_ids(2)], tok.eos_token_id), tok, lambda: spec.make(torch.Generator()),
                     [0], 1, params, limits)
    other = tok.encode("x", add_special_tokens=False)
    out = run_episodes(ForcedEngine([other + spelling.action_ids(0)[:1]], tok.eos_token_id), tok,
                       lambda: spec.make(torch.Generator()), [0], 1, params, limits)
    assert [t.info["invalid"] for t in out.turns] == [True]
    with pytest.raises(ValueError, match="special token"):
        Spelling.for_problem(bridge_problem(BridgeOptions()), tok, ("a", tok.eos_token))


@pytest.mark.parametrize("limit", ["max_turns", "max_context"])
def test_a_cut_off_game_is_refused(tiny32, limit):
    """``max_turns`` below the game's turns (or a context too short for it) would score the rest of the
    game 0, which the exact ``J`` does not: the bridge refuses the episode, naming the limit."""
    _, tok = tiny32
    spec = make_environment("bridge", {"turns": 3, "warmup_steps": 0}, tok, seed=0)
    a = Spelling.for_problem(bridge_problem(BridgeOptions(turns=3)), tok, ("a", "b")).action_ids(0)
    params = SamplingParams(max_new_tokens=1, stop_token_ids=(tok.eos_token_id,))
    first = ChatDelta(tok).prompt_ids(spec.make(torch.Generator()).reset(0))
    limits = AgentLimits(max_turns=2) if limit == "max_turns" else AgentLimits(max_context=len(first) + 3)
    with pytest.raises(InputError, match=f"config.rollout.{limit}.*cut off after"):
        run_episodes(ForcedEngine([a, a, a], tok.eos_token_id), tok, lambda: spec.make(torch.Generator()), [0], 1,
                     params, limits)
    # played to its end, the same game is accepted
    out = run_episodes(ForcedEngine([a, a, a], tok.eos_token_id), tok, lambda: spec.make(torch.Generator()), [0], 1,
                       params, AgentLimits(max_turns=3))
    assert out.episodes[0].outcome == "done" and out.episodes[0].num_turns == 3


# --------------------------------------------------------------------------- Monte Carlo (slow)


def top_p_action_probs(model, tok, problem, spelling, top_p: float) -> list[torch.Tensor]:
    """Exact action probabilities of the *nucleus-truncated* sampler (Hugging Face's top-p rule: after
    the temperature, drop the tokens whose ascending cumulative probability is at most ``1 - top_p``,
    keep at least the most likely one, renormalise): the policy a ``top_p < 1`` rollout plays."""
    chat = ChatDelta(tok)
    out = []
    for t, a_t in enumerate(problem.actions_per_turn):
        n_aug = problem.num_initial_states * math.prod((a + 1) * o for a, o in zip(problem.actions_per_turn[:t], problem.obs_per_turn[:t]))
        probs = torch.full((1, n_aug, a_t + 1), 1.0 / (a_t + 1), dtype=DTYPE)
        for h_aug in range(n_aug):
            rest, steps = h_aug, []
            for k in reversed(range(t)):
                rest, o = divmod(rest, problem.obs_per_turn[k])
                rest, a = divmod(rest, problem.actions_per_turn[k] + 1)
                steps.append((a, o))
            steps.reverse()
            if any(a == problem.actions_per_turn[k] for k, (a, _) in enumerate(steps)):
                continue  # after an invalid answer: never reached
            ctx = history_context(chat, problem, spelling, rest, [a for a, _ in steps], [o for _, o in steps])
            for a in range(a_t):
                ids = spelling.action_ids(a)
                with torch.no_grad():
                    logits = model(torch.tensor([ctx + ids[:-1]])).logits[0, len(ctx) - 1 :].to(DTYPE) / TAU
                p = 1.0
                for pos, token in enumerate(ids):
                    q = torch.softmax(logits[pos], -1)
                    asc, order = torch.sort(q)
                    drop = torch.cumsum(asc, 0) <= 1 - top_p
                    drop[-1] = False
                    kept = torch.zeros_like(q, dtype=torch.bool)
                    kept[order[~drop]] = True
                    p *= float(q[token] / q[kept].sum()) if kept[token] else 0.0
                probs[0, h_aug, a] = p
            probs[0, h_aug, a_t] = max(0.0, 1.0 - float(probs[0, h_aug, :a_t].sum()))
        out.append(probs)
    return out


def mc_trainer(tmp_path, overrides=()):
    """A real trainer (tiny Qwen3 after the bridge's format warm-up) whose rollouts are sampled below."""
    from seeupo.llm.models import tiny_qwen3
    from seeupo.llm.trainer import Trainer

    cfg = load_train_config(None, [
        "algorithm.group_size=16", "rollout.tasks_per_step=64", f"rollout.temperature={TAU}", "logging.progress=false",
        f"out_dir={tmp_path / 'run'}", "seed=5", *overrides,
    ])
    model, tok = tiny_qwen3(seed=0, dtype=torch.float32)
    return Trainer(cfg, model=model, tokenizer=tok)


def episode_returns(rollout) -> torch.Tensor:
    return per_trajectory(rollout.batch.traj_return, rollout.batch).to(DTYPE)


def sampled_returns(trainer, steps: int) -> torch.Tensor:
    """The per-episode returns in the training batches of ``steps`` rollouts (1024 episodes each)."""
    return torch.cat([episode_returns(trainer.rollout(step)) for step in range(1, steps + 1)])


def rollout_with(trainer, step: int, *, top_p: float = 1.0, max_turns: int | None = None):
    """:meth:`Trainer.rollout` with sampling or limits the config layer refuses for training, to show why."""
    cfg = trainer.cfg
    params = SamplingParams(temperature=cfg.rollout.temperature, top_p=top_p, max_new_tokens=trainer.env.max_new_tokens,
                            stop_token_ids=(trainer.tokenizer.eos_token_id,), seed=1_000 + step)
    generator = torch.Generator().manual_seed(2_000 + step)
    limits = AgentLimits(max_turns=max_turns or cfg.rollout.max_turns, max_context=cfg.rollout.max_context)
    return run_episodes(trainer.engine, trainer.tokenizer, lambda: trainer.env.make(generator), trainer.tasks_for(step),
                        cfg.algorithm.group_size, params, limits)


Z99 = 2.5758  # two-sided 99% normal quantile


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["default", "gamma"])
def test_monte_carlo_mean_return_matches_the_exact_J(tmp_path, setting):
    """The mean trained-on return of 6144 rollout episodes lies in the 99% interval around ``bridge/J``.

    ``default``: returns in {0, 0.5, 1}, standard deviation about 0.40, standard error about 0.005
    (observed: mean 0.3414, J 0.3385). ``gamma``: a 3-turn tree MDP with rewards at every turn, early
    ends and ``gamma = 0.5``; standard deviation about 0.65, standard error about 0.008 (observed:
    mean 0.9486, J 0.9499); the undiscounted exact value (1.44) is checked to lie far outside the
    interval, so the test would catch returns that are not discounted as ``J`` is.
    """
    options = dict(turns=3, kind="tree_mdp", gamma=0.5, problem_seed=3) if setting == "gamma" else {}
    trainer = mc_trainer(tmp_path, [f"env.options.{k}={v}" for k, v in options.items()])
    exact = trainer.env.metrics(trainer.policy)["bridge/J"]
    returns = sampled_returns(trainer, 6)
    mean, se = float(returns.mean()), float(returns.std() / math.sqrt(returns.numel()))
    print(f"{setting}: mean {mean:.5f} exact J {exact:.5f} se {se:.5f} n {returns.numel()}")
    assert abs(mean - exact) <= Z99 * se
    if setting == "gamma":
        problem = bridge_problem(BridgeOptions(**options))
        spelling = Spelling.for_problem(problem, trainer.tokenizer, ("a", "b"))
        probs = exact_action_probs(trainer.policy, trainer.tokenizer, problem, spelling)
        undiscounted = float(evaluate(dataclasses.replace(with_invalid_action(problem, 0.0), gamma=1.0), probs).J[0])
        print(f"undiscounted J {undiscounted:.5f}")
        assert abs(undiscounted - mean) > 5 * Z99 * se


@pytest.mark.slow
def test_monte_carlo_top_p_plays_another_policy_than_the_exact_J(tmp_path):
    """``top_p < 1``: the rollouts play the nucleus-truncated policy, whose exact value the sampled
    mean matches, while ``bridge/J`` (full softmax, like the policy's log-probabilities and the
    ratios) lies far outside the interval. So training with ``top_p < 1`` must be refused by the
    config layer: the ``J`` reported would not be the ``J`` of the sampler.

    Three one-token actions: after the warm-up the model answers about (0.48, 0.22, 0.30); top-p 0.6
    drops the least likely (its ascending cumulative mass 0.22 is below 0.4 with a margin of 0.18, the
    next 0.52 above it), so the truncated policy is far from the full one (J about 0.76 against
    0.52), with a standard error of about 0.005 on 3072 episodes.
    """
    top_p = TOP_P
    trainer = mc_trainer(tmp_path, ["env.options.actions=3", "env.options.alphabet=[a, b, c]"])
    exact = trainer.env.metrics(trainer.policy)["bridge/J"]
    problem = bridge_problem(BridgeOptions(actions=3))
    spelling = Spelling.for_problem(problem, trainer.tokenizer, ("a", "b", "c"))
    truncated = float(evaluate(with_invalid_action(problem, 0.0),
                               top_p_action_probs(trainer.model, trainer.tokenizer, problem, spelling, top_p)).J[0])
    returns = torch.cat([episode_returns(rollout_with(trainer, step, top_p=top_p)) for step in (1, 2, 3)])
    mean, se = float(returns.mean()), float(returns.std() / math.sqrt(returns.numel()))
    print(f"top_p {top_p}: mean {mean:.5f} exact J {exact:.5f} truncated J {truncated:.5f} se {se:.5f} n {returns.numel()}")
    assert abs(mean - truncated) <= Z99 * se
    assert abs(mean - exact) > 3 * Z99 * se


@pytest.mark.slow
def test_monte_carlo_max_turns_below_the_game_is_refused(tmp_path):
    """``max_turns`` below the game's turns: every episode would be cut off and score only its first
    turns, which ``bridge/J`` does not count. The first rollout refuses, naming the limit (the config
    layer refuses it earlier, from :func:`bridge_num_turns`); at ``max_turns = turns`` it samples."""
    trainer = mc_trainer(tmp_path)
    turns = bridge_num_turns(trainer.cfg.env.options)
    with pytest.raises(InputError, match="config.rollout.max_turns"):
        rollout_with(trainer, 1, max_turns=turns - 1)
    assert {e.outcome for e in rollout_with(trainer, 1, max_turns=turns).episodes} == {"done"}
