"""Building what a training run trains: the model, its copies and shards, and the rollout engine.

:func:`load_model` reads ``model.name`` of a config; :func:`build_models` turns the loaded
(and, for the bridge, warmed-up) model into the run's :class:`Models`: the policy, the frozen
reference (``algorithm.kl_coef > 0``), the critic (an advantage estimator that needs one, e.g.
``ppo``'s GAE) and the rollout engine, each sharded with FSDP2 and given activation
checkpointing when the run is one of several data-parallel processes
(:mod:`seeupo.llm.distributed`). The training loop itself is :class:`seeupo.llm.trainer.Trainer`.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seeupo.core.registry import adv_estimator
from seeupo.llm.config import TrainConfig
from seeupo.llm.distributed import (
    Distributed, barrier, broadcast_from_main, enable_activation_checkpointing, rollout_replica, shard_model,
)
from seeupo.llm.kernels import apply_layer_kernels
from seeupo.llm.policy import CausalLMPolicy, ReferencePolicy, ValueModel
from seeupo.llm.rollout import HFGenerateEngine, RolloutEngine
from seeupo.validation.errors import InputError

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


# the built-in models' transformers ``model_type`` (a local folder's is in its config.json)
BUILTIN_MODEL_TYPES = {"tiny-qwen3": "qwen3", "smollm2-135m": "llama"}


def load_model(name: str, dtype: str, seed: int) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` for ``model.name`` of a config (see :class:`seeupo.llm.config.ModelConfig`)."""
    torch_dtype = DTYPES[dtype]
    if name == "tiny-qwen3":
        from seeupo.llm.models import tiny_qwen3

        return tiny_qwen3(seed=seed, dtype=torch_dtype)
    if name == "smollm2-135m":
        from seeupo.llm.models import load_smollm2

        return load_smollm2(dtype=torch_dtype)
    check_model_name(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype, local_files_only=True)
    return model.eval(), AutoTokenizer.from_pretrained(name, local_files_only=True)


def check_model_name(name: str) -> None:
    """``model.name`` is a built-in model or a local folder, else one-line :class:`InputError`: read
    before a run or evaluation folder is created."""
    if name not in BUILTIN_MODEL_TYPES and not Path(name).is_dir():
        names = ", ".join(repr(n) for n in BUILTIN_MODEL_TYPES)
        raise InputError("config.model.name", f"{name!r} is not one of {names} or a local model folder")


def model_type(name: str) -> str | None:
    """The transformers ``model_type`` of ``model.name``, without loading the model (``None``: unknown)."""
    if name in BUILTIN_MODEL_TYPES:
        return BUILTIN_MODEL_TYPES[name]
    try:
        return json.loads((Path(name) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


@dataclass
class Models:
    """The models of a run, as :func:`build_models` makes them.

    policy: the trained policy (its ``model`` is the loaded model, sharded under FSDP).
    reference: the frozen copy of the starting policy the KL penalty reads (``None``: no KL).
    critic: the value model of GAE (``None``: the advantage estimator needs none).
    engine: the rollout engine; it samples from ``rollout_model``'s weights, synced after each update.
    rollout_model: the module whose weights the engine receives: the policy's model, or, under
      FSDP with the Hugging Face engine, a full replica of it on this process.
    """

    policy: CausalLMPolicy
    reference: ReferencePolicy | None
    critic: ValueModel | None
    engine: RolloutEngine
    rollout_model: torch.nn.Module


def build_models(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any, *, engine: RolloutEngine | None = None,
                 dist: Distributed | None = None) -> Models:
    """The policy, reference, critic and rollout engine of ``cfg`` around ``model`` (see :class:`Models`).

    ``model`` must be the whole model, already set up (e.g. warmed up): the reference and the
    critic start as copies of it. With ``dist`` every process first takes process 0's weights,
    then each model is sharded (:func:`seeupo.llm.distributed.shard_model`). ``engine`` replaces
    the default: a vLLM engine for ``rollout.engine: vllm``, else Hugging Face ``generate``.
    """
    algo, par = cfg.algorithm, cfg.parallel
    dp = dist.dp if dist is not None else None
    # one layout and one set of pass limits for every model: the update's micro-batches are the
    # policy's passes (CausalLMPolicy.micro_batches), the scoring passes use the same limits
    passes = dict(scoring=cfg.optim.scoring, micro_batch_rows=cfg.optim.micro_batch_rows,
                  micro_batch_tokens=cfg.optim.micro_batch_tokens, memory_share=par.memory_share, collective=dp)
    if dist is not None:
        broadcast_from_main(model)
    try:  # before the copies: the reference and the critic run the same kernels
        apply_layer_kernels(model, cfg.optim.layer_kernels, dist.device if dist is not None else next(model.parameters()).device)
    except ValueError as err:
        raise InputError("config.optim.layer_kernels", str(err)) from None
    reference_model = copy.deepcopy(model) if algo.kl_coef > 0 else None
    critic = None
    if adv_estimator(algo.advantage).needs_critic:
        critic = ValueModel.from_causal_lm(model, **passes)
    rollout_model = model
    if engine is None and cfg.rollout.engine == "vllm":
        engine = vllm_engine(cfg, model, tokenizer, dist)
    elif engine is None and dist is not None:
        # generation makes a different number of forward passes on each process, which a
        # sharded model cannot: each process samples from a full replica, synced every step
        rollout_model = rollout_replica(model, dist.device, torch.bfloat16 if par.mixed_precision == "bf16" else None)
    # one process trains on the CPU; under torchrun each process on its own device
    if par.checkpointing_on(dist.device if dist is not None else "cpu"):
        as_needed = par.activation_checkpointing == "as_needed"
        enable_activation_checkpointing(model, as_needed)
        if critic is not None:
            enable_activation_checkpointing(critic.backbone, as_needed)
    if dist is not None:
        shard = dict(mixed_precision=par.mixed_precision, cpu_offload=par.cpu_offload)
        shard_model(model, dist, **shard)
        if reference_model is not None:
            shard_model(reference_model, dist, **shard)
        if critic is not None:
            shard_model(critic, dist, layers_of=critic.backbone, **shard)
    policy = CausalLMPolicy(model, temperature=cfg.rollout.temperature, logprobs=cfg.optim.logprobs, **passes)
    reference = None
    if reference_model is not None:
        reference = ReferencePolicy(reference_model, temperature=cfg.rollout.temperature, copy_model=False,
                                    logprobs=cfg.optim.logprobs, **passes)
    if engine is None:
        engine = HFGenerateEngine(rollout_model, tokenizer.pad_token_id)
    return Models(policy=policy, reference=reference, critic=critic, engine=engine, rollout_model=rollout_model)


def vllm_engine(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any, dist: Distributed | None = None) -> RolloutEngine:
    """A vLLM engine per process, started from ``model``'s current weights (written once to
    ``out_dir/rollout_init`` by process 0, removed once every engine has loaded them)."""
    from seeupo.llm.vllm_engine import VLLMEngine

    kwargs: dict[str, Any] = {}
    if torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = cfg.rollout.vllm_gpu_memory_utilization
    if cfg.rollout.vllm_sleep:
        if not torch.cuda.is_available():
            raise InputError("config.rollout.vllm_sleep", "vLLM's sleep mode needs CUDA GPUs; set it to false")
        kwargs["enable_sleep_mode"] = True
    is_main = dist is None or dist.is_main
    folder = Path(cfg.out_dir) / "rollout_init"
    if is_main:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    barrier()
    rank = dist.dp.rank if dist is not None else 0
    engine = VLLMEngine(folder, dtype=cfg.model.dtype, seed=cfg.seed + rank, max_model_len=cfg.rollout.max_context, **kwargs)
    barrier()
    if is_main:
        shutil.rmtree(folder, ignore_errors=True)
    return engine
