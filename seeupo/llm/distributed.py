"""Training on several processes (GPUs, nodes) with ``torchrun`` and FSDP2.

``torchrun --nproc-per-node N -m seeupo train CONFIG`` starts ``N`` processes; each one

* rolls out ``tasks_per_step / N`` of the step's tasks (whole GRAE groups) with its own
  full-weight copy of the policy (the rollout replica, synced after every update);
* gathers the metadata of every process's rows (:func:`gather_batch`) so that advantages,
  minibatches and the sequential sweep are computed on the global batch, identically everywhere
  (:mod:`seeupo.core.parallel`), and runs only its own rows through the model;
* holds a shard of the policy, the reference model and the critic (FSDP2 ``fully_shard``, one
  unit per decoder layer plus the root), optionally with bf16 mixed precision over float32 master
  weights, activation checkpointing and CPU offload; gradients are summed across processes, so
  an update is the single-process update on the whole batch.

The process group and the device come from torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``): NCCL for CUDA tensors and gloo for CPU ones.
See ``docs/distributed.md`` for multi-node launches.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from seeupo.core.batch import SampleBatch
from seeupo.core.parallel import DataParallel

Tensor = torch.Tensor

# the SampleBatch fields every process holds for every row (data stays with its owner)
METADATA = ("traj_id", "group_id", "turn", "logp_old", "token_mask", "valid", "reward", "traj_return", "weight", "instance")


@dataclass(frozen=True)
class Distributed:
    """This process in a ``torchrun`` launch: its data-parallel place, its device and its device mesh."""

    dp: DataParallel
    local_rank: int
    device: torch.device
    mesh: Any

    @property
    def is_main(self) -> bool:
        return self.dp.rank == 0


def launched_by_torchrun() -> bool:
    """Whether this process was started by ``torchrun`` (or another launcher that sets its variables)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed() -> Distributed:
    """Join the process group described by torchrun's environment variables."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"  # metadata collectives run on CPU tensors
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    global _joined
    _joined = True
    world_size = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world_size,))
    return Distributed(DataParallel(dist.get_rank(), world_size), local_rank, device, mesh)


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


_joined = False  # set by init_distributed


def joined_process_group() -> bool:
    """Whether this process joined a process group (:func:`init_distributed`), shut down since or not."""
    return _joined


def exit_skipping_teardown(status: int) -> NoReturn:
    """End a torchrun process with ``status`` once its work is written and its process group shut down,
    without the interpreter's teardown: there a C++ thread of torch's (torch 2.13, gloo) was seen to abort a
    rank that had finished its work ("terminate called without an active exception", SIGABRT) in two test
    runs on a loaded machine (not reproduced in 30 launches beside three busy processes), and torchrun then
    reports the whole run failed. The standard streams and ``logging`` are flushed first; Python's ``atexit``
    handlers do not run, so whatever must reach disk (metrics, checkpoints, TensorBoard) is closed before this
    is called."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def broadcast_from_main(module: torch.nn.Module) -> None:
    """Give every process process 0's parameters and buffers (before sharding: each shard is cut
    from its own process's copy, so the copies must agree)."""
    import torch.distributed as dist

    for tensor in module.state_dict().values():
        dist.broadcast(tensor.data, src=0)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face model (the classes it names in ``_no_split_modules``),
    sharded or not (FSDP2 gives each sharded module a subclass of its own class, ``FSDP<name>``)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]
    if not layers:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} (no _no_split_modules)")
    return layers


def enable_activation_checkpointing(model: torch.nn.Module, as_needed: bool = False, keep_attention: bool = True) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of storing them.

    transformers checkpoints a layer only while the layer is in training mode; the policy keeps
    the model in eval mode (no dropout, so that recomputed log-probabilities equal the sampled
    ones). Only the layers' own ``training`` flag is set, not their children's: the checkpoint
    runs and every dropout inside stays off. ``as_needed``: each training pass recomputes only
    the layers its memory requires (:func:`seeupo.llm.memory.recomputing`). ``keep_attention``:
    a recomputed layer keeps its attention kernel's inputs and output, and its recomputation
    replays that output instead of calling the kernel again (:mod:`seeupo.llm.memory`; it takes
    effect through the tree attention function, :mod:`seeupo.llm.tree_attention`); ``False``
    recomputes everything, the least memory and the reference it is tested against.
    """
    from seeupo.llm.memory import AS_NEEDED, KEEPS_ATTENTION, attention_keeping_contexts

    kwargs: dict = {"use_reentrant": False}
    if keep_attention:
        kwargs["context_fn"] = attention_keeping_contexts
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.23 (5.17 on the GPU image) has only the older name, deprecated since
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    for layer in decoder_layers(model):
        layer.training = True
    object.__setattr__(model, AS_NEEDED, as_needed)
    for module in (model, getattr(model, "base_model", model)):  # a critic built on the backbone reads it there
        object.__setattr__(module, KEEPS_ATTENTION, keep_attention)


def shard_model(
    model: torch.nn.Module,
    env: Distributed,
    *,
    mixed_precision: str = "none",
    cpu_offload: bool = False,
    layers_of: torch.nn.Module | None = None,
) -> torch.nn.Module:
    """FSDP2 over ``env``'s processes: one unit per decoder layer (of ``layers_of``, default ``model``) and the root.

    ``mixed_precision="bf16"`` computes in bfloat16 and reduces gradients in float32, the
    parameters (and so the optimizer's master weights) staying in their own dtype. ``cpu_offload``
    keeps parameters, gradients and optimizer state on the CPU between uses. Gradients are
    **summed** over the processes (:mod:`seeupo.core.parallel`).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if mixed_precision not in ("none", "bf16"):
        raise ValueError(f"mixed_precision must be 'none' or 'bf16', got {mixed_precision!r}")
    if not cpu_offload:
        model.to(env.device)
    kwargs: dict[str, Any] = {"mesh": env.mesh, "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy()}
    if mixed_precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    units = [*decoder_layers(layers_of if layers_of is not None else model), model]
    for unit in units:
        fully_shard(unit, **kwargs)
    for unit in units:  # per unit: the settings do not recurse
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The whole (unsharded) state dict of a sharded or plain model, on every process."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def rollout_replica(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A full copy of ``model`` for sampling (taken before sharding): generation makes a different
    number of forward passes on each process, which a sharded model cannot do."""
    replica = copy.deepcopy(model).to(device)
    if dtype is not None:
        replica.to(dtype)
    replica.eval().requires_grad_(False)
    return replica


def gather_batch(local: SampleBatch, dp: DataParallel) -> SampleBatch:
    """The global batch of every process's rows, in rank order, with ``owner`` set.

    Trajectory and group ids are offset by the counts of the lower ranks (so they stay dense and
    a process's groups stay whole); ``logp_old``/``token_mask`` are padded to the widest; ``data``
    holds this process's rows' payload, zeros elsewhere (other processes' rows never go through
    this process's model). A single-process run on the concatenated rows has the same batch.
    """
    import torch.distributed as dist

    parts: list[dict[str, Tensor] | None] = [None] * dp.world_size
    dist.all_gather_object(parts, {name: getattr(local, name) for name in METADATA})
    width = max(p["logp_old"].shape[1] for p in parts)
    fields: dict[str, list[Tensor]] = {name: [] for name in METADATA}
    traj_offset = group_offset = 0
    for part in parts:
        n_traj = int(part["traj_id"].max()) + 1 if part["traj_id"].numel() else 0
        n_groups = int(part["group_id"].max()) + 1 if part["group_id"].numel() else 0
        for name in METADATA:
            value = part[name]
            if name == "traj_id":
                value = value + traj_offset
            elif name == "group_id":
                value = value + group_offset
            elif name in ("logp_old", "token_mask"):
                value = torch.nn.functional.pad(value, (0, width - value.shape[1]))
            fields[name].append(value)
        traj_offset, group_offset = traj_offset + n_traj, group_offset + n_groups
    counts = [p["traj_id"].numel() for p in parts]
    owner = torch.repeat_interleave(torch.arange(dp.world_size), torch.tensor(counts))
    start = sum(counts[: dp.rank])
    data = {}
    for key, value in local.data.items():
        full = torch.zeros((sum(counts),) + tuple(value.shape[1:]), dtype=value.dtype)
        full[start : start + value.shape[0]] = value
        data[key] = full
    return SampleBatch(**{name: torch.cat(values) for name, values in fields.items()}, data=data, owner=owner)


def split_groups(batch: SampleBatch, parts: int, index: int) -> SampleBatch:
    """The ``index``-th of ``parts`` equal slices of ``batch``'s groups, ids renumbered from 0.

    What one process of ``parts`` holds after rolling out its share of the tasks: the inverse of
    :func:`gather_batch` (used by tests and by replays of recorded batches).
    """
    n_groups = batch.num_groups
    if n_groups % parts:
        raise ValueError(f"{n_groups} groups cannot be split into {parts} equal parts")
    per = n_groups // parts
    rows = (batch.group_id >= index * per) & (batch.group_id < (index + 1) * per)
    part = batch.select(rows)
    _, traj = torch.unique(part.traj_id, return_inverse=True)
    return part.with_updates(traj_id=traj, group_id=part.group_id - index * per, owner=None)
