"""Resumable checkpoints: everything a run needs to continue as if it had never stopped.

A checkpoint is a folder ``checkpoints/step_<N>/`` holding

* ``sharded/``: the models' and optimizers' state dicts, written with
  ``torch.distributed.checkpoint`` (DCP): each process writes its own shards, and a run may
  resume on any number of processes, one included (DCP re-shards on load);
* ``state.pt``: the small replicated state (scheduler, the trainer's step counters);
* ``rng_<rank>.pt``: each process's random-number generators (Python, NumPy, torch);
* ``meta.json``: step, time, config, number of processes.

It is written under a temporary name and renamed into place once every process has written
its part, and ``checkpoints/latest`` is replaced atomically after it, so a crash at any moment
leaves the last complete checkpoint usable (``state.pt`` is written last).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seeupo.llm.distributed import barrier

LATEST = "latest"


def rng_state() -> dict[str, Any]:
    """The states of every random-number generator a run draws from."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the generators saved by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _dcp(function, *args, **kwargs):
    """A ``torch.distributed.checkpoint`` call; in a single process, without its warning that it is one."""
    import warnings

    import torch.distributed as dist

    if dist.is_initialized():
        return function(*args, **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return function(*args, **kwargs)


def save_checkpoint(
    root: str | Path,
    step: int,
    state: dict[str, Any],
    meta: dict[str, Any] | None = None,
    keep: int | None = None,
    *,
    sharded: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` under ``root`` and point ``root/latest`` at it.

    With a process group, every process calls this (``root`` on a filesystem they share).

    Args:
      state: the replicated state, anything ``torch.save`` takes (process 0 writes it).
      meta: JSON-ready facts shown to people (``meta.json``).
      keep: keep only the newest ``keep`` checkpoints (``None``: all).
      sharded: state dicts of models and optimizers (``torch.distributed.checkpoint.state_dict
        .get_state_dict``), written by every process with ``torch.distributed.checkpoint``.
    """
    import torch.distributed.checkpoint as dcp

    root = Path(root)
    final = root / f"step_{step:08d}"
    tmp = root / f".step_{step:08d}.tmp"
    rank = _rank()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier()
    if sharded is not None:
        _dcp(dcp.save, sharded, checkpoint_id=tmp / "sharded")
    torch.save(rng_state(), tmp / f"rng_{rank}.pt")
    barrier()
    if rank == 0:
        torch.save(state, tmp / "state.pt")
        (tmp / "meta.json").write_text(json.dumps({"step": step, "time": time.time(), **(meta or {})}, indent=1) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _write_atomic(root / LATEST, final.name + "\n")
        if keep is not None:
            for old in sorted(root.glob("step_*"))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or ``None``."""
    root = Path(root)
    pointer = root / LATEST
    if pointer.exists():
        path = root / pointer.read_text().strip()
        if (path / "state.pt").exists():
            return path
    complete = [p for p in sorted(root.glob("step_*")) if (p / "state.pt").exists()]
    return complete[-1] if complete else None


def checkpoint_step(path: str | Path) -> int:
    """The training steps a checkpoint folder ``step_<N>`` holds: ``N`` (read from its name, without loading it)."""
    return int(Path(path).name.removeprefix("step_"))


def saved_run_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The config a run folder was started with: its ``config.yaml``, else the one recorded in
    its newest checkpoint's ``meta.json``; ``None`` when it has neither (no run yet)."""
    from seeupo.llm.config import read_yaml
    from seeupo.validation.files import read_json

    run_dir = Path(run_dir)
    if (run_dir / "config.yaml").is_file():
        return read_yaml(run_dir / "config.yaml")
    latest = latest_checkpoint(run_dir / "checkpoints")
    if latest is not None and (latest / "meta.json").is_file():
        meta = read_json(latest / "meta.json")
        if isinstance(meta, dict) and isinstance(meta.get("config"), dict):
            return meta["config"]
    return None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The ``state`` saved in checkpoint folder ``path`` (on the CPU)."""
    return torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)


def load_sharded(path: str | Path, template: dict[str, Any]) -> dict[str, Any]:
    """Fill ``template`` (state dicts shaped like this process's, e.g. from ``get_state_dict``)
    from the ``sharded/`` part of checkpoint ``path``, whatever number of processes wrote it."""
    import torch.distributed.checkpoint as dcp

    _dcp(dcp.load, template, checkpoint_id=Path(path) / "sharded")
    return template


def load_rng(path: str | Path) -> dict[str, Any] | None:
    """This process's generator states of checkpoint ``path`` (process 0's when it had fewer processes)."""
    path = Path(path)
    for name in (f"rng_{_rank()}.pt", "rng_0.pt"):
        if (path / name).exists():
            return torch.load(path / name, map_location="cpu", weights_only=False)
    return None


def load_model_weights(path: str | Path, model: torch.nn.Module) -> None:
    """Load the policy weights of checkpoint ``path`` into ``model`` (a plain or sharded model).

    The checkpoint's parameter names and shapes are compared with the model's first, from the
    checkpoint's metadata (nothing is read yet): a checkpoint of another model raises
    ``InputError`` naming the checkpoint, the first parameter that differs and both shapes,
    where loading would fail deep in ``torch.distributed.checkpoint`` with a size-mismatch traceback.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from seeupo.validation.errors import InputError

    template = get_model_state_dict(model)
    try:
        metadata = FileSystemReader(Path(path) / "sharded").read_metadata().state_dict_metadata
    except (OSError, ValueError, EOFError) as err:
        raise InputError(None, f"checkpoint {path}: cannot read its weights ({err})") from None
    saved = {key[len("model."):]: tuple(meta.size) for key, meta in metadata.items()
             if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)}
    wanted = {key: tuple(value.shape) for key, value in template.items()}
    other = "is a checkpoint of another model (check config model.name)"
    for key, shape in wanted.items():
        if key not in saved:
            raise InputError(None, f"checkpoint {path} {other}: it has no parameter {key!r} "
                                   f"(the model's is {list(shape)}; the checkpoint has {len(saved)} parameters, the model {len(wanted)})")
        if saved[key] != shape:
            raise InputError(None, f"checkpoint {path} {other}: parameter {key!r} has shape {list(saved[key])} "
                                   f"in the checkpoint and {list(shape)} in the model")
    extra = sorted(set(saved) - set(wanted))
    if extra:
        raise InputError(None, f"checkpoint {path} {other}: the model has no parameter {extra[0]!r} "
                               f"({len(extra)} parameters of the checkpoint are not in the model)")
    state = load_sharded(path, {"model": template})
    set_model_state_dict(model, state["model"])
