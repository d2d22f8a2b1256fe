"""The multi-turn agent loop: batch layout, placeholders, limits, and token-in/token-out end to end."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")
pytest.importorskip("tokenizers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")

from seeupo.core.config import preset
from seeupo.core.update import compute_advantages, policy_update
from seeupo.llm.agent import AgentLimits, ChatDelta, StepResult, run_episodes
from seeupo.llm.policy import CausalLMPolicy, ValueModel, clipped_value_loss
from seeupo.llm.rollout import Completion, HFGenerateEngine, SamplingParams


class CountingEnv:
    """Task ``(target, length)``: the episode lasts ``length`` turns; reward 1 per turn whose text contains ``target``."""

    def reset(self, task):
        self.target, self.length = task
        self.k = 0
        return [{"role": "system", "content": "Count."}, {"role": "user", "content": f"Say {self.target}."}]

    def step(self, assistant_text, token_ids):
        self.k += 1
        done = self.k >= self.length
        reward = float(self.target in assistant_text)
        return StepResult(None if done else f"turn {self.k} ok", reward, done, {"k": self.k})


class ScriptedEngine:
    """Answers ``"answer <call number>"`` and the end-of-turn token, each token with log-prob -0.5."""

    def __init__(self, tokenizer, stop: bool = True):
        self.tokenizer, self.stop, self.calls = tokenizer, stop, 0

    def generate(self, prompts, n, params):
        self.calls += 1
        ids = self.tokenizer.encode(f"answer {self.calls}", add_special_tokens=False)
        ids = (ids + [self.tokenizer.eos_token_id] if self.stop else ids)[: params.max_new_tokens]
        reason = "stop" if self.stop and len(ids) and ids[-1] == self.tokenizer.eos_token_id else "length"
        return [[Completion(list(ids), [-0.5] * len(ids), reason) for _ in range(n)] for _ in prompts]

    def sync_weights(self, model):
        pass


class RecordingEngine:
    """Wraps an engine and keeps every answer it gave."""

    def __init__(self, engine):
        self.engine, self.answers = engine, []

    def generate(self, prompts, n, params):
        out = self.engine.generate(prompts, n, params)
        self.answers.append(out)
        return out

    def sync_weights(self, model):
        self.engine.sync_weights(model)


def _row_tokens(batch, i):
    start = int(batch.data["response_start"][i])
    length = int(batch.token_mask[i].sum())
    ids = batch.data["input_ids"][i]
    return ids[:start].tolist(), ids[start : start + length].tolist()


@pytest.mark.parametrize("stop", [True, False])
def test_scripted_batch_layout_and_exact_chat_text(tiny32, stop):
    _, tokenizer = tiny32
    tasks = [("answer", 1), ("answer", 3), ("nope", 2)]
    params = SamplingParams(max_new_tokens=16, stop_token_ids=(tokenizer.eos_token_id,))
    out = run_episodes(ScriptedEngine(tokenizer, stop), tokenizer, CountingEnv, tasks, 2, params, AgentLimits(max_turns=4))
    b = out.batch
    assert b.num_rows == 6 * 3  # 6 trajectories x T = 3 (the longest episode)
    assert b.traj_id.tolist() == [k for k in range(6) for _ in range(3)]
    assert b.group_id.tolist() == [k // 2 for k in range(6) for _ in range(3)]
    assert b.turn.tolist() == [0, 1, 2] * 6
    per_task_valid = {0: [1, 0, 0], 1: [1, 1, 1], 2: [1, 1, 0]}
    assert b.valid.int().tolist() == [v for k in range(6) for v in per_task_valid[k // 2]]
    per_task_reward = {0: [1, 0, 0], 1: [1, 1, 1], 2: [0, 0, 0]}
    assert b.reward.tolist() == [float(r) for k in range(6) for r in per_task_reward[k // 2]]
    assert b.traj_return.tolist() == [float(sum(per_task_reward[k // 2])) for k in range(6) for _ in range(3)]
    assert torch.all(b.weight == 1) and torch.all(b.instance == 0)
    assert torch.all(b.logp_old[b.token_mask] == -0.5) and torch.all(b.logp_old[~b.token_mask] == 0)
    assert not b.token_mask[~b.valid].any()
    assert [e.outcome for e in out.episodes] == ["done"] * 6
    assert [e.num_turns for e in out.episodes] == [1, 1, 3, 3, 2, 2]

    # trajectory 2 (task 1): each turn's context extends the previous context + response (never re-encoded)
    rows = [2 * 3 + t for t in range(3)]
    ctx0, resp0 = _row_tokens(b, rows[0])
    for i in rows[1:]:
        ctx, resp = _row_tokens(b, i)
        assert ctx[: len(ctx0) + len(resp0)] == ctx0 + resp0
        ctx0, resp0 = ctx, resp
    # and its token ids spell exactly the chat template's rendering of the conversation
    chat = ChatDelta(tokenizer)
    messages = CountingEnv().reset(tasks[1])
    for record in [r for r in out.turns if r.traj_id == 2]:
        messages.append({"role": "assistant", "content": record.response_text})
        if record.observation is not None:
            messages.append({"role": "user", "content": record.observation})
    ctx, resp = _row_tokens(b, rows[-1])
    text = tokenizer.decode(ctx + resp) + ("" if stop else "<|im_end|>") + "\n"
    assert text == chat.render(messages, add_generation_prompt=False)


def test_limits_max_turns_and_context(tiny32):
    _, tokenizer = tiny32
    params = SamplingParams(max_new_tokens=16, stop_token_ids=(tokenizer.eos_token_id,))
    out = run_episodes(ScriptedEngine(tokenizer), tokenizer, CountingEnv, [("answer", 5)], 1, params, AgentLimits(max_turns=2))
    assert out.batch.num_rows == 2 and out.episodes[0].outcome == "max_turns"

    prompt = len(ChatDelta(tokenizer).prompt_ids(CountingEnv().reset(("answer", 5))))
    for room in [3, 8, 20]:
        limits = AgentLimits(max_turns=5, max_context=prompt + room)
        out = run_episodes(ScriptedEngine(tokenizer), tokenizer, CountingEnv, [("answer", 5)], 2, params, limits)
        assert [e.outcome for e in out.episodes] == ["context", "context"]
        assert out.batch.data["attention_mask"].sum(1).max() <= limits.max_context
        if room == 3:  # the first response is cut at the remaining room
            assert out.turns[0].response_tokens == 3 and out.turns[0].finish_reason == "length"


def test_prompt_longer_than_the_context(tiny32):
    _, tokenizer = tiny32
    params = SamplingParams(max_new_tokens=4, stop_token_ids=(tokenizer.eos_token_id,))
    with pytest.raises(ValueError, match="no episode sampled a turn"):
        run_episodes(ScriptedEngine(tokenizer), tokenizer, CountingEnv, [("a", 1)], 2, params, AgentLimits(max_context=5))


def test_template_that_rewrites_history_is_rejected(tiny32):
    _, tokenizer = tiny32
    odd = copy.deepcopy(tokenizer)
    odd.chat_template = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="append-only"):
        ChatDelta(odd).delta_text([{"role": "user", "content": "hi"}])


def test_tiny_qwen3_token_in_token_out_end_to_end(tiny32):
    model, tokenizer = tiny32
    model = copy.deepcopy(model)
    tau = 0.9
    engine = RecordingEngine(HFGenerateEngine(model, tokenizer.pad_token_id))
    params = SamplingParams(temperature=tau, max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,), seed=0)
    tasks = [("a", 1), ("e", 3)]
    out = run_episodes(engine, tokenizer, CountingEnv, tasks, 3, params, AgentLimits(max_turns=3, max_context=256))
    b = out.batch
    T = 3
    assert b.num_rows == 6 * T
    # the response tokens in the batch are exactly the sampled ones, in the engine's order
    first = [c for group in engine.answers[0] for c in group]
    for k in range(6):
        assert _row_tokens(b, k * T)[1] == first[k].token_ids
    for t in range(1, T):
        live = [k for k in range(6) if b.valid[k * T + t]]
        assert [_row_tokens(b, k * T + t)[1] for k in live] == [g[0].token_ids for g in engine.answers[t]]
    # the policy at the sampling temperature reproduces the engine's log-probabilities
    policy = CausalLMPolicy(model, temperature=tau, micro_batch_rows=4)
    logp = policy.token_logps(b)
    assert (logp.detach() - b.logp_old).abs().max() < 1e-5
    assert torch.all(logp[~b.valid] == 0)

    # the batch drives a core update (SeeUPO preset): a finite step that moves the weights
    cfg = preset("seeupo", group_size=3)
    adv = compute_advantages(b, cfg)
    before = [p.detach().clone() for p in model.parameters()]
    stats = policy_update(policy, torch.optim.SGD(policy.parameters(), lr=1e-2), b, adv, cfg)
    assert stats.steps >= T and all(torch.isfinite(torch.tensor(stats.objective)))
    assert any((p - q).abs().max() > 0 for p, q in zip(model.parameters(), before))


def test_context_reuse_rolls_out_the_same_episodes(tiny64):
    # the engine keeps each trajectory's key/values between turns; the episodes are the ones of
    # the engine that prefills every turn's whole context, and later turns forward fewer tokens
    model, tokenizer = tiny64
    params = SamplingParams(temperature=0.9, max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,), seed=0)
    out, forwarded = {}, {}
    for reuse in (False, True):
        engine = HFGenerateEngine(model, tokenizer.pad_token_id, reuse_contexts=reuse)
        counted = []
        handle = model.register_forward_pre_hook(lambda m, a, kw: counted.append(kw["input_ids"].numel()), with_kwargs=True)
        try:
            out[reuse] = run_episodes(engine, tokenizer, CountingEnv, [("a", 1), ("e", 3)], 3, params,
                                      AgentLimits(max_turns=3, max_context=256), dtype=torch.float64)
        finally:
            handle.remove()
        forwarded[reuse] = sum(counted)
    a, b = out[False].batch, out[True].batch
    assert torch.equal(a.data["input_ids"], b.data["input_ids"]) and torch.equal(a.token_mask, b.token_mask)
    assert torch.equal(a.reward, b.reward) and torch.equal(a.valid, b.valid)
    assert (a.logp_old - b.logp_old).abs().max() < 1e-9
    assert max(t.turn for t in out[True].turns) == 2
    assert forwarded[True] < forwarded[False]


def test_critic_values_drive_gae_and_the_value_loss(tiny32):
    model, tokenizer = tiny32
    model = copy.deepcopy(model)
    engine = HFGenerateEngine(model, tokenizer.pad_token_id)
    params = SamplingParams(temperature=1.0, max_new_tokens=5, seed=4)
    out = run_episodes(engine, tokenizer, CountingEnv, [("a", 1), ("e", 3)], 2, params, AgentLimits(max_turns=3))
    b = out.batch
    critic = ValueModel.from_causal_lm(model, micro_batch_rows=4)
    old_values = critic.values(b).detach()
    cfg = preset("ppo")  # token-level GAE, gamma = lambda = 1
    adv = compute_advantages(b, cfg, critic_values=old_values)
    # a zero critic (zero-initialised head): every token's advantage is the trajectory's reward-to-go
    T = int(b.turn.max()) + 1
    reward = b.reward.reshape(-1, T)
    to_go = reward.flip(1).cumsum(1).flip(1).reshape(-1)
    mask = b.token_mask & b.valid[:, None]
    torch.testing.assert_close(adv[mask], to_go[:, None].expand_as(adv)[mask].to(adv.dtype))
    assert torch.all(adv[~mask] == 0)
    # one critic step on the clipped value loss towards the GAE returns moves the critic's values
    returns = adv + old_values
    optimizer = torch.optim.SGD(critic.parameters(), lr=0.1)
    loss = clipped_value_loss(critic.values(b), old_values, returns, mask, clip_eps=0.2)
    loss.backward()
    optimizer.step()
    assert loss.item() > 0 and (critic.values(b).detach() - old_values)[mask].abs().max() > 0


class SilentEnv:
    """Two turns; after the first one the environment says nothing (``observation=None``)."""

    def reset(self, task):
        self.k = 0
        return [{"role": "user", "content": "go"}]

    def step(self, assistant_text, token_ids):
        self.k += 1
        return StepResult(None if self.k == 1 else "x", 0.0, self.k >= 2, {})


def test_silent_observation(tiny32):
    _, tokenizer = tiny32
    params = SamplingParams(max_new_tokens=16, stop_token_ids=(tokenizer.eos_token_id,))
    out = run_episodes(ScriptedEngine(tokenizer), tokenizer, SilentEnv, [None], 1, params)
    ctx, resp = _row_tokens(out.batch, 1)
    # no observation: the assistant turn is closed and the next generation prompt follows directly
    assert tokenizer.decode(ctx) == (
        "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\nanswer 1<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(resp) == "answer 2<|im_end|>"


def test_observation_role(tiny32):
    _, tokenizer = tiny32
    params = SamplingParams(max_new_tokens=16, stop_token_ids=(tokenizer.eos_token_id,))
    limits = AgentLimits(observation_role="tool")
    out = run_episodes(ScriptedEngine(tokenizer), tokenizer, CountingEnv, [("answer", 2)], 1, params, limits)
    ctx, _ = _row_tokens(out.batch, 1)
    assert tokenizer.decode(ctx).endswith(
        "answer 1<|im_end|>\n<|im_start|>tool\nturn 1 ok<|im_end|>\n<|im_start|>assistant\n"
    )


class RandomPromptEnv(CountingEnv):
    """Each rollout of a task gets its own prompt (e.g. a sampled persona)."""

    count = 0

    def reset(self, task):
        messages = super().reset(task)
        RandomPromptEnv.count += 1
        messages[0]["content"] = f"Count, persona {RandomPromptEnv.count}."
        return messages


def test_rollouts_with_different_prompts_keep_their_own(tiny32):
    _, tokenizer = tiny32
    engine = RecordingEngine(ScriptedEngine(tokenizer))
    params = SamplingParams(max_new_tokens=16, stop_token_ids=(tokenizer.eos_token_id,))
    out = run_episodes(engine, tokenizer, RandomPromptEnv, [("answer", 1)], 3, params)
    contexts = [tokenizer.decode(_row_tokens(out.batch, k)[0]) for k in range(3)]
    assert len(set(contexts)) == 3 and all("persona" in c for c in contexts)
    assert len(engine.answers[0]) == 3  # one prompt per rollout, not one per task


class TruncatedEnv(CountingEnv):
    """A CountingEnv that scores an episode the loop cut short: reward 10 and the outcome in the info."""

    def truncate(self, outcome):
        self.truncated = outcome
        return StepResult(None, 10.0, True, {"truncated": outcome})


def test_episodes_the_loop_ends_are_scored_by_truncate(tiny32):
    _, tok = tiny32
    envs = []

    def make():
        envs.append(TruncatedEnv())
        return envs[-1]

    params = SamplingParams(max_new_tokens=4)
    out = run_episodes(ScriptedEngine(tok), tok, make, [("answer", 3), ("answer", 1)], 1, params, AgentLimits(max_turns=2))
    # task 0 needs 3 turns but the loop stops it at 2: truncate adds 10 to its last turn; task 1 ends itself
    assert getattr(envs[0], "truncated", None) == "max_turns" and not hasattr(envs[1], "truncated")
    batch = out.batch
    assert batch.reward.tolist() == [1.0, 11.0, 1.0, 0.0]
    assert batch.traj_return[0] == 12.0 and out.episodes[0].traj_return == 12.0
    last = [t for t in out.turns if t.traj_id == 0][-1]
    assert last.reward == 11.0 and last.info["truncated"] == "max_turns"


class DiscountedEnv(CountingEnv):
    """A CountingEnv that declares its discount, as the bridge does with its problem's ``gamma``."""

    gamma = 0.5


def test_the_environment_discount_is_the_return_discount(tiny32):
    """``traj_return = sum_t gamma^t r_t`` with the environment's ``gamma`` (one source); a caller's gamma
    that contradicts it, or environments that disagree, are refused; without one, ``gamma = 1``."""
    _, tok = tiny32
    params = SamplingParams(max_new_tokens=4)
    out = run_episodes(ScriptedEngine(tok), tok, DiscountedEnv, [("answer", 3)], 1, params)
    assert out.batch.reward.tolist() == [1.0, 1.0, 1.0]
    assert out.batch.traj_return[0] == 1.75 and out.episodes[0].traj_return == 1.75
    assert run_episodes(ScriptedEngine(tok), tok, DiscountedEnv, [("answer", 3)], 1, params, gamma=0.5).batch.traj_return[0] == 1.75
    assert run_episodes(ScriptedEngine(tok), tok, CountingEnv, [("answer", 3)], 1, params).batch.traj_return[0] == 3.0
    assert run_episodes(ScriptedEngine(tok), tok, CountingEnv, [("answer", 3)], 1, params, gamma=0.5).batch.traj_return[0] == 1.75
    with pytest.raises(ValueError, match="contradicts"):
        run_episodes(ScriptedEngine(tok), tok, DiscountedEnv, [("answer", 3)], 1, params, gamma=1.0)
    envs = iter([DiscountedEnv(), CountingEnv(), type("Other", (CountingEnv,), {"gamma": 0.9})()])
    with pytest.raises(ValueError, match="different discounts"):
        run_episodes(ScriptedEngine(tok), tok, lambda: next(envs), [("answer", 1)], 3, params)
