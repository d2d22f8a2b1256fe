"""The algorithms of :mod:`seeupo.core` on language models.

* :mod:`seeupo.llm.models`: the tiny random Qwen3 (tests) and SmolLM2-135M-Instruct (offline).
* :mod:`seeupo.llm.layout`: the token layout of ``SampleBatch.data`` and the packing of rows that share prefixes;
* :mod:`seeupo.llm.policy`: a causal LM as a core ``Policy``;
  the frozen reference model; the critic and its clipped value loss; :mod:`seeupo.llm.passes`: the
  forward passes they score a batch with (which rows each pass forwards, its inputs, what it reads).
* :mod:`seeupo.llm.logprobs`: token log-probabilities from the last hidden states and the LM head
  without the ``[positions, vocabulary]`` tensor (chunked, or liger-kernel's fused kernel on CUDA).
* :mod:`seeupo.llm.rollout`: rollout engines (token ids in, token ids and log-probabilities out).
* :mod:`seeupo.llm.agent`: environments and the multi-turn agent loop that builds the batch.
* :mod:`seeupo.llm.build`: loading the model and building a run's policy, reference, critic and
  rollout engine (FSDP2 shards); :mod:`seeupo.llm.trainer`: the environment's warm-up and the
  training loop; :mod:`seeupo.llm.metrics`: what a step logs, under verl's names.
* :mod:`seeupo.llm.table_model`: ``TableLM``, a "model" whose logits are a tabular policy's table, and
  its rollout engine: the whole LLM path checked exactly against the tabular engine.

Needs the ``llm`` extra (``pip install -e '.[llm]'``); importing this package imports neither
transformers nor tokenizers.
"""
